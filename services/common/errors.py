"""Meridian's exception tree, mapped once to HTTP (OpenAI error format) and to gRPC status.

Every failure that can reach a client is one of these; the edge renders it as
``{"error": {"message", "type", "param", "code"}}`` with the status below, and the worker and
router raise it as the gRPC status below (the edge maps that back with :func:`from_grpc`).

    MeridianError                      HTTP  OpenAI type             gRPC
    ├── InvalidRequest                 400   invalid_request_error   INVALID_ARGUMENT
    │   └── ContextLengthExceeded      400   invalid_request_error   INVALID_ARGUMENT
    ├── AuthenticationFailed           401   invalid_request_error   UNAUTHENTICATED
    ├── PermissionDenied               403   permission_error        PERMISSION_DENIED
    │   └── RegionNotAllowed           403   permission_error        FAILED_PRECONDITION
    ├── NotFound                       404   invalid_request_error   NOT_FOUND
    │   └── ModelNotFound              404   invalid_request_error   NOT_FOUND
    ├── PayloadTooLarge                413   invalid_request_error   INVALID_ARGUMENT
    ├── RateLimited                    429   rate_limit_error        RESOURCE_EXHAUSTED
    ├── Overloaded                     503   overloaded_error        RESOURCE_EXHAUSTED
    ├── Unavailable                    503   service_unavailable     UNAVAILABLE
    ├── UpstreamFailed                 502   server_error            INTERNAL
    ├── UpstreamTimeout                504   timeout_error           DEADLINE_EXCEEDED
    └── InternalError                  500   server_error            INTERNAL

``Overloaded`` and ``RateLimited`` carry ``retry_after_s`` (sent as ``Retry-After``). gRPC
details travel in trailing metadata: ``meridian-error-param``, ``meridian-error-code`` and
``meridian-retry-after-ms``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import grpc

PARAM_KEY = "meridian-error-param"
CODE_KEY = "meridian-error-code"
RETRY_AFTER_KEY = "meridian-retry-after-ms"


class MeridianError(Exception):
    """Base of every client-visible failure."""

    http_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.retry_after_s = retry_after_s

    def to_openai(self) -> dict[str, dict[str, str | None]]:
        """The body of the HTTP error response, in OpenAI's format."""
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def grpc_trailers(self) -> tuple[tuple[str, str], ...]:
        """Trailing metadata that carries param/code/retry-after over gRPC."""
        md: list[tuple[str, str]] = []
        if self.param:
            md.append((PARAM_KEY, self.param))
        if self.code:
            md.append((CODE_KEY, self.code))
        if self.retry_after_s is not None:
            md.append((RETRY_AFTER_KEY, str(int(self.retry_after_s * 1000))))
        return tuple(md)


class InvalidRequest(MeridianError):
    http_status = 400
    openai_type = "invalid_request_error"
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class AuthenticationFailed(MeridianError):
    http_status = 401
    openai_type = "invalid_request_error"
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    default_code = "invalid_api_key"


class PermissionDenied(MeridianError):
    http_status = 403
    openai_type = "permission_error"
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class RegionNotAllowed(PermissionDenied):
    """The model is served, but in no region this request may use (data residency)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    default_code = "region_not_allowed"


class NotFound(MeridianError):
    http_status = 404
    openai_type = "invalid_request_error"
    grpc_code = grpc.StatusCode.NOT_FOUND


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class PayloadTooLarge(MeridianError):
    http_status = 413
    openai_type = "invalid_request_error"
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "payload_too_large"


class RateLimited(MeridianError):
    http_status = 429
    openai_type = "rate_limit_error"
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_code = "rate_limit_exceeded"


class Overloaded(MeridianError):
    """No allowed capacity right now (admission control); retry after ``retry_after_s``."""

    http_status = 503
    openai_type = "overloaded_error"
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_code = "overloaded"


class Unavailable(MeridianError):
    http_status = 503
    openai_type = "service_unavailable"
    grpc_code = grpc.StatusCode.UNAVAILABLE
    default_code = "unavailable"


class UpstreamFailed(MeridianError):
    http_status = 502
    openai_type = "server_error"
    grpc_code = grpc.StatusCode.INTERNAL
    default_code = "upstream_failed"


class UpstreamTimeout(MeridianError):
    http_status = 504
    openai_type = "timeout_error"
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_code = "upstream_timeout"


class InternalError(MeridianError):
    http_status = 500
    openai_type = "server_error"
    grpc_code = grpc.StatusCode.INTERNAL
    default_code = "internal_error"


_FROM_GRPC: dict[grpc.StatusCode, type[MeridianError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationFailed,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: RegionNotAllowed,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: UpstreamTimeout,
}

_BY_CODE: dict[str, type[MeridianError]] = {
    "context_length_exceeded": ContextLengthExceeded,
    "model_not_found": ModelNotFound,
    "rate_limit_exceeded": RateLimited,
}


def from_grpc(
    code: grpc.StatusCode | None,
    details: str | None,
    trailers: Iterable[tuple[str, str | bytes]] | None = None,
) -> MeridianError:
    """Rebuild the Meridian error a peer raised (or describe a transport failure)."""
    md = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (trailers or ())}
    err_code = md.get(CODE_KEY)
    cls = _BY_CODE.get(err_code or "") or _FROM_GRPC.get(code or grpc.StatusCode.UNKNOWN)
    retry_ms = md.get(RETRY_AFTER_KEY)
    retry_after = int(retry_ms) / 1000 if retry_ms and retry_ms.isdigit() else None
    message = details or (code.name if code else "upstream error")
    if cls is None:
        return UpstreamFailed(f"upstream error: {message}", retry_after_s=retry_after)
    return cls(message, param=md.get(PARAM_KEY), code=err_code, retry_after_s=retry_after)


def is_retryable_elsewhere(err: MeridianError) -> bool:
    """Whether another worker might succeed where this one failed (before the first token)."""
    return isinstance(err, Overloaded | Unavailable | UpstreamFailed | UpstreamTimeout)
