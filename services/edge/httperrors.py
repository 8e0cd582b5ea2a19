"""HTTP-only failures the edge answers that the shared tree (services.common.errors) lacks.

They extend that tree, so the error boundary renders them like every other error::

    MeridianError
    ├── InvalidRequest
    │   ├── RequestTimeout       408  the client sent its body (or headers) too slowly
    │   ├── UnsupportedContentEncoding
    │   │                        415  a body in a Content-Encoding the edge does not decode
    │   ├── UnsupportedCharset   415  a body declared in a charset other than UTF-8
    │   ├── UriTooLong           414  a request target over the line limit
    │   ├── TransferCodingNotImplemented
    │   │                        501  a Transfer-Encoding other than chunked
    │   ├── HttpVersionNotSupported
    │   │                        505  a request that is not HTTP/1.0 or 1.1 (h2c included)
    │   └── HeadersTooLarge      431  a header line, field or count over the limit
    ├── Interrupted               a request the edge ended while it ran (guard.InFlight)
    │   ├── ShuttingDown         503  still running when the edge's drain grace ended
    │   ├── KeyRevoked           401  its API key was revoked (or expired) meanwhile
    │   └── TenantDisabled       403  its organization was disabled meanwhile
    └── Conflict                 409  admin API: the tenant already exists

(each ``Interrupted`` also derives from the error it is a case of: ``Unavailable``,
``AuthenticationFailed``, ``PermissionDenied``, so a handler of those sees it.)

They live here until another service needs them (then they belong in services.common).
"""

from __future__ import annotations

from services.common.errors import (
    AuthenticationFailed,
    InvalidRequest,
    MeridianError,
    PermissionDenied,
    Unavailable,
)


class RequestTimeout(InvalidRequest):
    http_status = 408
    default_code = "request_timeout"


class UnsupportedContentEncoding(InvalidRequest):
    http_status = 415
    default_code = "unsupported_content_encoding"


class UnsupportedCharset(InvalidRequest):
    http_status = 415
    default_code = "unsupported_charset"


class UriTooLong(InvalidRequest):
    http_status = 414
    default_code = "uri_too_long"


class TransferCodingNotImplemented(InvalidRequest):
    http_status = 501
    default_code = "unsupported_transfer_encoding"


class HttpVersionNotSupported(InvalidRequest):
    http_status = 505
    default_code = "http_version_not_supported"

    @classmethod
    def of(cls, version: str) -> HttpVersionNotSupported:
        """For a request in ``version`` (``"HTTP/2.0"``; "" when the request did not say)."""
        said = version or "This HTTP version"
        return cls(
            f"{said} is not supported: this endpoint speaks HTTP/1.1 (and 1.0). OpenAI "
            "clients use HTTP/1.1."
        )


class HeadersTooLarge(InvalidRequest):
    http_status = 431
    default_code = "headers_too_large"


class Conflict(MeridianError):
    http_status = 409
    openai_type = "invalid_request_error"
    default_code = "conflict"


class Interrupted(MeridianError):
    """A request the edge ended while it ran (:meth:`services.edge.guard.Lifecycle.cut`): its
    own status before its response started, the stream's last SSE event (then ``[DONE]``)
    after; either way the worker call is cancelled and the usage settled."""


class ShuttingDown(Unavailable, Interrupted):
    """A request still running when the edge's drain grace ended (services/edge/guard.py:
    :class:`~services.edge.guard.Lifecycle`)."""

    default_code = "edge_shutting_down"


class KeyRevoked(AuthenticationFailed, Interrupted):
    """A request whose API key was revoked (or reached its expiry and was re-checked) while
    it ran (services/edge/tenancy/revocation.py): a leaked key's long streams end too."""

    default_code = "invalid_api_key"


class TenantDisabled(PermissionDenied, Interrupted):
    """A request whose organization was disabled while it ran."""

    default_code = "tenant_disabled"
