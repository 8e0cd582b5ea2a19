"""HTTP/1.1 as bytes on a socket, for what ordinary clients will not send: header bytes that
are not UTF-8, a body shorter than its Content-Length, odd transfer codings."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RawAnswer:
    head: bytes  # the status line and the headers
    body: bytes  # as long as its Content-Length says (empty without one)

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])


async def exchange(url: str, data: bytes, *, timeout_s: float = 10.0) -> RawAnswer:
    """Send ``data`` as it is to ``url``'s host and port (``http://host:port``); the answer's
    head and body. The body may be left unsent: the answer may come before it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await asyncio.wait_for(reader.readexactly(length), timeout_s)
        return RawAnswer(head, body)
    finally:
        writer.close()
        with contextlib.suppress(OSError):  # closed by the edge first: closed either way
            await writer.wait_closed()
