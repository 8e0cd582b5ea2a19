"""Static files, served properly: read once at start, never from disk per request.

Every file under ``static/`` is loaded into memory with its SHA-256; its response carries a
strong ``ETag`` (``If-None-Match`` answers 304), a gzip body when the client accepts it and it
is smaller (precompressed once; ``Vary: Accept-Encoding``; each encoding has its own ETag),
and the security headers of :data:`SECURITY_HEADERS` — among them a Content-Security-Policy
that allows scripts, styles and connections from this origin only, no inline script or style,
and HTML only through DOMPurify's Trusted Types policy.

Cache-busting without a build step: in the HTML pages, every ``"/static/NAME"`` reference to a
known file becomes ``"/static/NAME?v=<hash>"``; a request with the current ``v`` is cached for
a year (``immutable``), any other (an old page, a hand-typed URL) is ``no-cache`` and
revalidated by ETag. So a deploy is seen at the next page load, and a page never mixes old and
new scripts.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent / "static"

CONTENT_TYPES: Mapping[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}
_COMPRESSIBLE = (".html", ".js", ".css", ".json", ".svg", ".txt")
_MIN_GZIP_BYTES = 512

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types dompurify",
    )
)

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
HSTS = "max-age=31536000"

CACHE_VERSIONED = "public, max-age=31536000, immutable"
CACHE_REVALIDATE = "no-cache"
CACHE_PRIVATE = "private, no-store"

_REFERENCE = re.compile(r"([\"'])/static/([A-Za-z0-9_./-]+)\1")


@dataclass(frozen=True, slots=True)
class Asset:
    name: str
    body: bytes
    gzipped: bytes | None  # None: not worth compressing
    content_type: str
    digest: str  # hex SHA-256 of ``body``

    @property
    def version(self) -> str:
        return self.digest[:16]

    def etag(self, encoding: str) -> str:
        return f'"{self.version}.gz"' if encoding == "gzip" else f'"{self.version}"'


def _asset(name: str, body: bytes) -> Asset:
    suffix = Path(name).suffix
    if suffix not in CONTENT_TYPES:
        raise ValueError(f"static/{name}: no content type for {suffix!r} files")
    gz = None
    if suffix in _COMPRESSIBLE and len(body) >= _MIN_GZIP_BYTES:
        packed = gzip.compress(body, compresslevel=6, mtime=0)
        gz = packed if len(packed) < len(body) else None
    return Asset(name, body, gz, CONTENT_TYPES[suffix], hashlib.sha256(body).hexdigest())


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (``q=0`` refuses it)."""
    for part in header.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip()
            return not (q.startswith("q=") and _qvalue(q[2:]) == 0)
    return False


def _qvalue(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 1.0


def etag_matches(header: str, etag: str) -> bool:
    """``If-None-Match`` (a list, ``*``, weak or strong tags) against our strong ``etag``."""
    if header.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == etag for t in header.split(","))


class AssetStore:
    """Every file of one static folder, in memory (see the module docstring)."""

    def __init__(self, root: Path = STATIC_DIR, *, hsts: bool = False) -> None:
        self._hsts = hsts
        raw: dict[str, bytes] = {}
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                raw[path.relative_to(root).as_posix()] = path.read_bytes()
        plain = {n: _asset(n, b) for n, b in raw.items() if not n.endswith(".html")}
        self._assets: dict[str, Asset] = dict(plain)
        for name, body in raw.items():
            if name.endswith(".html"):
                self._assets[name] = _asset(name, self._versioned(body.decode(), plain).encode())

    @staticmethod
    def _versioned(html: str, assets: Mapping[str, Asset]) -> str:
        def replace(m: re.Match[str]) -> str:
            quote, name = m.group(1), m.group(2)
            asset = assets.get(name)
            if asset is None:
                raise ValueError(f"an HTML page refers to /static/{name}, which does not exist")
            return f"{quote}/static/{name}?v={asset.version}{quote}"

        return _REFERENCE.sub(replace, html)

    def names(self) -> list[str]:
        return sorted(self._assets)

    def get(self, name: str) -> Asset | None:
        return self._assets.get(name)

    def url(self, name: str) -> str:
        return f"/static/{name}?v={self._assets[name].version}"

    def headers(self) -> dict[str, str]:
        """The security headers every page response carries."""
        out = dict(SECURITY_HEADERS)
        if self._hsts:
            out["Strict-Transport-Security"] = HSTS
        return out

    def respond(
        self, request: web.Request, asset: Asset, *, cache: str, status: int = 200
    ) -> web.Response:
        """``asset`` for ``request``: 304 when its ETag matches, gzip when accepted."""
        gzip_ok = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        encoding = "gzip" if asset.gzipped and gzip_ok else ""
        etag = asset.etag(encoding)
        headers = self.headers()
        headers.update({"ETag": etag, "Cache-Control": cache, "Vary": "Accept-Encoding"})
        if status == 200 and etag_matches(request.headers.get("If-None-Match", ""), etag):
            return web.Response(status=304, headers=headers)
        body = asset.body
        if encoding:
            assert asset.gzipped is not None
            body = asset.gzipped
            headers["Content-Encoding"] = "gzip"
        headers["Content-Type"] = asset.content_type
        return web.Response(status=status, body=body, headers=headers)
