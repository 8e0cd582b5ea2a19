"""Network address parsing shared by every CLI that takes ``HOST:PORT``."""

from __future__ import annotations

import ipaddress
import re
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
    elif not _HOST_RE.match(host):
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
