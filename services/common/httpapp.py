"""What every Meridian HTTP listener answers with, whoever serves it (edge API, admin API,
metrics, router debug): a ``Server`` header that names the product and nothing else.

aiohttp's default is ``Server: Python/3.11 aiohttp/3.14.5`` — exact versions, which is what a
scanner looks for first. The header is set in ``on_response_prepare``, which aiohttp runs just
before it would fill in its own (``headers.setdefault``).
"""

from __future__ import annotations

from aiohttp import web

SERVER_HEADER = "meridian"


async def _name_server(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


def hide_version_banner(app: web.Application) -> web.Application:
    """``app``, answering ``Server: meridian``; returns it for chaining."""
    app.on_response_prepare.append(_name_server)
    return app
