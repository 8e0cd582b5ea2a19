"""A request body's ``Content-Encoding``, decoded by the edge rather than by aiohttp's parser.

aiohttp decompresses a body inside its HTTP parser (``auto_decompress``), where nothing of
ours can answer for it: a body that claims gzip or deflate but is not compressed fails as a
``RequestPayloadError`` out of ``request.read()`` (a 500 with a traceback) and again when
aiohttp drains the unread rest after the response, which it logs with a traceback too —
for a client refused before its body was read (a bad key) as well; and a coding it has no
library for (``br``) is refused with aiohttp's own "Please install `Brotli`". So both
listeners (public and admin) turn ``auto_decompress`` off, and the handlers that read a body
decode it here, after the compressed bytes arrived within the size limit:

- ``identity`` (or no header): the body as sent;
- ``gzip`` (``x-gzip``) or ``deflate`` (zlib-wrapped as RFC 9110 says, or raw deflate as
  some clients send it): one complete stream, nothing after it, inflated to at most
  ``max_bytes`` (a compression bomb is a 413, not memory) — else a 400 saying so;
- anything else, or more than one coding: a 415 naming what is supported (with an
  ``Accept-Encoding`` header listing it, as RFC 9110 §15.5.16 suggests).
"""

from __future__ import annotations

import zlib

from aiohttp import web

from services.common.errors import InvalidRequest, PayloadTooLarge
from services.edge.httperrors import TransferCodingNotImplemented, UnsupportedContentEncoding
from services.edge.middleware.error_boundary import RESPONSE_HEADERS

#: What the edge decodes, as the 415 and its ``Accept-Encoding`` header list it.
SUPPORTED_CODINGS = ("gzip", "deflate", "identity")
_ALIASES = {"x-gzip": "gzip"}
#: zlib's ``wbits`` to try, in order: gzip's header and trailer; zlib-wrapped deflate, then
#: raw deflate (it has no header to recognise, so it is the fallback).
_WBITS = {"gzip": (16 + zlib.MAX_WBITS,), "deflate": (zlib.MAX_WBITS, -zlib.MAX_WBITS)}


def content_coding(request: web.Request) -> str | None:
    """The one coding applied to ``request``'s body (None: identity); 415 for any other.

    Checked before the body is read: a coding the edge cannot decode is refused at once.
    One coding at most: stacked codings are not something clients send, and each layer
    could inflate up to the body limit again."""
    transfer = [
        token.strip().lower()
        for value in request.headers.getall("Transfer-Encoding", ())
        for token in value.split(",")
        if token.strip()
    ]
    if transfer and transfer != ["chunked"]:
        # aiohttp de-chunks and ignores the rest: a gzip transfer coding would reach the
        # parser still compressed. RFC 9112: an unknown transfer coding is a 501.
        raise TransferCodingNotImplemented(
            f"unsupported Transfer-Encoding '{', '.join(transfer)[:80]}'; only chunked is "
            "decoded (compress the body with Content-Encoding instead)",
            param="Transfer-Encoding",
        )
    codings = [
        _ALIASES.get(token.strip().lower(), token.strip().lower())
        for value in request.headers.getall("Content-Encoding", ())
        for token in value.split(",")
    ]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _WBITS:
        return codings[0]
    given = ", ".join(codings)
    # The client learns what to send instead (kept on the error response by the boundary).
    request.setdefault(RESPONSE_HEADERS, {})["Accept-Encoding"] = ", ".join(SUPPORTED_CODINGS)
    raise UnsupportedContentEncoding(
        f"unsupported Content-Encoding '{given}'; supported: {', '.join(SUPPORTED_CODINGS)}"
        + (" (one of them at most)" if len(codings) > 1 else ""),
        param="Content-Encoding",
    )


def decode_body(raw: bytes, coding: str | None, *, max_bytes: int) -> bytes:
    """``raw`` decoded from ``coding`` (see :func:`content_coding`), at most ``max_bytes``
    long: 400 if it is not that coding's data, 413 if it inflates past the limit."""
    if coding is None or not raw:
        return raw
    failures: list[str] = []
    for wbits in _WBITS[coding]:
        inflater = zlib.decompressobj(wbits)
        try:
            body = inflater.decompress(raw, max_bytes + 1)
        except zlib.error as err:  # "Error -3 while decompressing data: incorrect header check"
            failures.append(f"it is not {coding} data ({str(err).rpartition(': ')[2]})")
            continue
        if len(body) > max_bytes:
            raise PayloadTooLarge(
                f"request body is larger than {max_bytes} bytes once decoded "
                f"(Content-Encoding: {coding})"
            )
        if not inflater.eof:
            failures.append(f"the {coding} data is truncated")
        elif inflater.unused_data:
            failures.append(f"data follows the end of the {coding} stream")
        else:
            return body
    # The first way of reading it is what the header claims; its failure is the one to tell.
    raise InvalidRequest(
        f"The request body could not be decoded with Content-Encoding '{coding}': {failures[0]}.",
        param="Content-Encoding",
        code="invalid_content_encoding",
    )
