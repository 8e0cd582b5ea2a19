"""Request bodies decoded from their Content-Encoding by the edge (services/edge/request_body.py):
gzip and deflate (zlib-wrapped or raw) bounded by the body limit, anything else refused with a
status that says why — never a parser failure."""

from __future__ import annotations

import gzip
import zlib

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from services.common.errors import InvalidRequest, PayloadTooLarge
from services.edge.httperrors import UnsupportedContentEncoding
from services.edge.middleware.error_boundary import RESPONSE_HEADERS
from services.edge.request_body import content_coding, decode_body

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'


def request(*encodings: str) -> web.Request:
    headers = CIMultiDict([("Content-Encoding", e) for e in encodings])
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers)


@pytest.mark.parametrize(
    ("encodings", "coding"),
    [
        ((), None),
        (("identity",), None),
        (("gzip",), "gzip"),
        (("GZip",), "gzip"),
        (("x-gzip",), "gzip"),
        (("deflate",), "deflate"),
        (("identity, gzip",), "gzip"),
        (("identity", "deflate"), "deflate"),
    ],
)
def test_the_content_coding_is_read_from_the_header(
    encodings: tuple[str, ...], coding: str | None
) -> None:
    assert content_coding(request(*encodings)) == coding


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br", "gzip, gzip"])
def test_a_content_coding_the_edge_does_not_decode_is_415_naming_the_supported_ones(
    encoding: str,
) -> None:
    req = request(encoding)
    with pytest.raises(UnsupportedContentEncoding) as refused:
        content_coding(req)
    err = refused.value
    assert err.http_status == 415
    assert (err.param, err.code) == ("Content-Encoding", "unsupported_content_encoding")
    assert f"unsupported Content-Encoding '{encoding}'" in err.message
    assert "supported: gzip, deflate, identity" in err.message
    assert req[RESPONSE_HEADERS] == {"Accept-Encoding": "gzip, deflate, identity"}


@pytest.mark.parametrize(
    ("coding", "raw"),
    [
        (None, BODY),
        ("gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate", zlib.compress(BODY)[2:-4]),  # raw deflate, as some clients send it
    ],
)
def test_compressed_bodies_are_decoded(coding: str | None, raw: bytes) -> None:
    assert decode_body(raw, coding, max_bytes=1024) == BODY


@pytest.mark.parametrize(
    ("coding", "raw", "why"),
    [
        ("gzip", BODY, "it is not gzip data"),
        ("deflate", BODY, "it is not deflate data"),
        ("gzip", gzip.compress(BODY)[:-5], "truncated"),
        ("deflate", zlib.compress(BODY)[:-8], "truncated"),
        ("gzip", gzip.compress(BODY) + b"junk", "data follows the end of the gzip stream"),
        ("gzip", zlib.compress(BODY), "it is not gzip data"),
    ],
)
def test_a_body_that_is_not_in_its_content_encoding_is_400(
    coding: str, raw: bytes, why: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        decode_body(raw, coding, max_bytes=1024)
    err = refused.value
    assert err.http_status == 400
    assert err.message.startswith(
        f"The request body could not be decoded with Content-Encoding '{coding}'"
    )
    assert why in err.message
    assert (err.param, err.code) == ("Content-Encoding", "invalid_content_encoding")


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_body_that_inflates_past_the_limit_is_413_without_inflating_it_all(coding: str) -> None:
    bomb = (gzip.compress if coding == "gzip" else zlib.compress)(b"\0" * 50_000_000)
    assert len(bomb) < 100_000
    with pytest.raises(PayloadTooLarge, match="larger than 4096 bytes once decoded"):
        decode_body(bomb, coding, max_bytes=4096)


def test_an_empty_body_is_empty_whatever_its_coding() -> None:
    assert decode_body(b"", "gzip", max_bytes=1024) == b""
