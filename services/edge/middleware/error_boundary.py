"""The error boundary both edge apps (public and admin) share: every failure leaves in
OpenAI's error format with the right status, and nothing leaks a stack trace.

Headers a stage set before failing (``x-request-id``, the ``x-ratelimit-*`` of a 429) are kept
on the error response: they are stored on the request under :data:`RESPONSE_HEADERS`.
"""

from __future__ import annotations

import logging
import math

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.typedefs import Handler

from services.common.errors import (
    InternalError,
    InvalidRequest,
    MeridianError,
    NotFound,
    PayloadTooLarge,
)

log = logging.getLogger("meridian.edge")

RESPONSE_HEADERS = web.RequestKey("response_headers", dict[str, str])


def error_response(err: MeridianError, headers: dict[str, str] | None = None) -> web.Response:
    out = dict(headers or {})
    if err.retry_after_s is not None:
        out["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
        out["retry-after-ms"] = str(max(1, math.ceil(err.retry_after_s * 1000)))
    return web.json_response(err.to_openai(), status=err.http_status, headers=out)


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's handling of ``Expect`` (it runs before any middleware), with its 417 in
    OpenAI's format: ``100-continue`` is answered, any other expectation refused."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the body's response has not started
        return None
    shown = expect if len(expect) <= 64 and expect.isprintable() else f"{expect[:64]!r}…"
    resp = error_response(
        InvalidRequest(
            f"Unsupported Expect header {shown!r}: only '100-continue' is understood",
            param="Expect",
            code="expectation_failed",
        )
    )
    resp.set_status(417)
    return resp


@web.middleware
async def error_boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except MeridianError as err:
        return error_response(err, request.get(RESPONSE_HEADERS))
    except web.HTTPRequestEntityTooLarge as err:
        return error_response(PayloadTooLarge(f"request body is too large: {err.text}"))
    except web.HTTPNotFound:
        return error_response(NotFound(f"Unknown path: {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed as err:
        allowed = ", ".join(sorted(err.allowed_methods))
        resp = error_response(
            InvalidRequest(
                f"method {request.method} is not allowed on {request.path} (allowed: {allowed})"
            ),
            {"Allow": allowed},
        )
        resp.set_status(405)
        return resp
    except web.HTTPException:
        raise
    except Exception:  # the boundary: log with trace, answer in the API's format
        log.exception("unhandled error", extra={"meridian_fields": {"path": request.path}})
        return error_response(InternalError("internal error"), request.get(RESPONSE_HEADERS))
