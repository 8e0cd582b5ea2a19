import grpc
import pytest

from services.common import errors


@pytest.mark.parametrize(
    ("err", "status", "openai_type"),
    [
        (errors.InvalidRequest("bad", param="messages"), 400, "invalid_request_error"),
        (errors.ContextLengthExceeded("long", param="messages"), 400, "invalid_request_error"),
        (errors.AuthenticationFailed("who?"), 401, "invalid_request_error"),
        (errors.RegionNotAllowed("nope"), 403, "permission_error"),
        (errors.ModelNotFound("no such", param="model"), 404, "invalid_request_error"),
        (errors.PayloadTooLarge("big"), 413, "invalid_request_error"),
        (errors.RateLimited("slow down", retry_after_s=2), 429, "rate_limit_error"),
        (errors.Overloaded("full", retry_after_s=1), 503, "overloaded_error"),
        (errors.Unavailable("down"), 503, "service_unavailable"),
        (errors.UpstreamFailed("boom"), 502, "server_error"),
        (errors.UpstreamTimeout("slow"), 504, "timeout_error"),
    ],
)
def test_each_error_renders_openai_format_with_its_status(
    err: errors.MeridianError, status: int, openai_type: str
) -> None:
    body = err.to_openai()
    assert err.http_status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == openai_type
    assert body["error"]["message"] == err.message


@pytest.mark.parametrize(
    "err",
    [
        errors.InvalidRequest("temperature out of range", param="temperature"),
        errors.ContextLengthExceeded("prompt too long", param="messages"),
        errors.ModelNotFound("unknown", param="model"),
        errors.Overloaded("saturated", retry_after_s=1.5),
        errors.Unavailable("draining", retry_after_s=1),
        errors.RegionNotAllowed("residency"),
    ],
)
def test_errors_survive_a_grpc_round_trip(err: errors.MeridianError) -> None:
    back = errors.from_grpc(err.grpc_code, err.message, err.grpc_trailers())
    assert type(back) is type(err)
    assert back.param == err.param
    assert back.code == err.code
    assert back.retry_after_s == err.retry_after_s


def test_transport_failure_without_trailers_is_unavailable() -> None:
    back = errors.from_grpc(grpc.StatusCode.UNAVAILABLE, "connection refused", ())
    assert isinstance(back, errors.Unavailable)
    assert errors.is_retryable_elsewhere(back)


def test_unknown_grpc_status_becomes_upstream_failure() -> None:
    back = errors.from_grpc(grpc.StatusCode.DATA_LOSS, "oops", None)
    assert isinstance(back, errors.UpstreamFailed)
    assert errors.is_retryable_elsewhere(back)


def test_bad_requests_are_not_retried_elsewhere() -> None:
    assert not errors.is_retryable_elsewhere(errors.InvalidRequest("x"))
    assert not errors.is_retryable_elsewhere(errors.ModelNotFound("x"))
