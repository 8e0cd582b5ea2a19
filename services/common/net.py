"""Network addresses shared by every service: ``HOST:PORT`` parsing for CLIs, URL masking for
people, and a free local port for launchers and tests."""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit, urlunsplit

_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def parse_address(value: str) -> str:
    """Validate ``host:port`` (IPv6 as ``[::1]:port``) and return it normalised."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: expected HOST:PORT with a port in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{value!r}: invalid IPv6 address") from None
    elif not _HOST_RE.fullmatch(host):
        raise ValueError(f"{value!r}: invalid host name")
    return f"{host}:{int(port)}"


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (``redis://user:pw@h`` →
    ``redis://user:***@h``), for messages and banners: a URL may carry a credential."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it). Another process may take it
    before the caller binds it; launchers and tests that need a port *before* starting a
    server accept that small race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
