"""The admin API on its own port (token in constant time, never on the public port), and the
CLI that drives it, against a real edge and a real Redis (the router is absent: not needed)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.errors import AuthenticationFailed
from services.common.net import free_port
from services.edge.tenancy.cli import build_parser as build_keys_parser
from tests.support.builders import TEST_ADMIN_TOKEN
from tests.support.inproc import RunningEdge, start_edge
from tests.support.rawhttp import exchange
from tests.support.redis_proc import RedisProcess
from tests.support.wait import eventually

AUTH = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


@pytest.fixture
async def edge(redis_url: str) -> AsyncIterator[RunningEdge]:
    e = await start_edge(redis_url=redis_url, router_address=f"127.0.0.1:{free_port()}")
    yield e
    await e.stop()


async def call(
    edge: RunningEdge,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, edge.admin_url + path, json=body, headers=AUTH if headers is None else headers
        ) as resp,
    ):
        return resp.status, await resp.json(), dict(resp.headers)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": f"Basic {TEST_ADMIN_TOKEN}"},
        {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}x"},
    ],
)
async def test_the_admin_api_needs_the_admin_token(
    edge: RunningEdge, headers: dict[str, str]
) -> None:
    status, body, _ = await call(edge, "GET", "/admin/tenants", headers=headers)
    assert status == 401
    assert body["error"]["code"] == "invalid_admin_token"


async def test_an_authorization_header_that_is_not_utf8_is_401_not_a_500(
    edge: RunningEdge,
) -> None:
    answer = await exchange(
        edge.admin_url,
        b"GET /admin/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3abcdef\r\n"
        b"Connection: close\r\n\r\n",
    )
    assert answer.status == 401, answer.head
    body = answer.body
    assert json.loads(body)["error"]["code"] == "invalid_admin_token"


async def test_the_admin_api_is_not_on_the_public_port(edge: RunningEdge) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(edge.url + "/admin/stats", headers=AUTH) as resp,
    ):
        assert resp.status == 404


async def test_tenants_are_created_changed_listed_and_deleted(edge: RunningEdge) -> None:
    tenant = {
        "tenant_id": "acme",
        "tier": "high",
        "allowed_regions": ["kr"],
        "limits": {"rpm": 60, "tpm": 10_000},
        "key_limits": {"max_streams": 2},
    }
    status, created, _ = await call(edge, "POST", "/admin/tenants", tenant)
    assert status == 201
    assert created["tier"] == "high"
    assert created["created_ms"] > 0
    status, body, _ = await call(edge, "POST", "/admin/tenants", tenant)
    assert (status, body["error"]["code"]) == (409, "conflict")
    status, patched, _ = await call(edge, "PATCH", "/admin/tenants/acme", {"tier": "low"})
    assert (status, patched["tier"], patched["limits"]["rpm"]) == (200, "low", 60)
    status, listed, _ = await call(edge, "GET", "/admin/tenants")
    assert [t["tenant_id"] for t in listed["tenants"]] == ["acme"]
    assert (await call(edge, "DELETE", "/admin/tenants/acme"))[0] == 200
    status, body, _ = await call(edge, "GET", "/admin/tenants/acme")
    assert (status, body["error"]["code"]) == (404, "tenant_not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tenant_id": "acme", "limits": {"rpm": -1}}, "limits.rpm"),
        ({"tenant_id": "acme", "tier": "platinum"}, "tier"),
        ({"tenant_id": "bad id"}, "tenant_id"),
        ({"tenant_id": "acme", "bogus": 1}, "bogus"),
        ([1, 2], None),
    ],
)
async def test_invalid_tenants_are_400_naming_the_field(
    edge: RunningEdge, body: Any, param: str | None
) -> None:
    status, answer, _ = await call(edge, "POST", "/admin/tenants", body)
    assert status == 400
    assert answer["error"]["param"] == param


@pytest.mark.parametrize(
    "field",
    ["tier", "allowed_models", "allowed_regions", "limits", "key_limits", "disabled"],
)
async def test_a_null_field_in_a_tenant_patch_is_400_naming_it(
    edge: RunningEdge, field: str
) -> None:
    await call(edge, "POST", "/admin/tenants", {"tenant_id": "demo", "limits": {"rpm": 5}})
    status, answer, _ = await call(edge, "PATCH", "/admin/tenants/demo", {field: None})
    assert status == 400
    assert answer["error"]["param"] == field
    assert answer["error"]["type"] == "invalid_request_error"
    assert "must not be null" in answer["error"]["message"]
    status, tenant, _ = await call(edge, "GET", "/admin/tenants/demo")
    assert (status, tenant["limits"]["rpm"], tenant["disabled"]) == (200, 5, False)  # unchanged
    # A limit's own null still lifts it.
    status, patched, _ = await call(edge, "PATCH", "/admin/tenants/demo", {"limits": {"rpm": None}})
    assert (status, patched["limits"]["rpm"]) == (200, None)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/admin/tenants/acme/keys", {"name": None}, "name"),
        ("/admin/keys/{key_id}/rotate", {"grace_s": None}, "grace_s"),
    ],
)
async def test_a_null_field_in_a_key_body_is_400_naming_it(
    edge: RunningEdge, path: str, body: dict[str, Any], param: str
) -> None:
    await call(edge, "POST", "/admin/tenants", {"tenant_id": "acme"})
    _, created, _ = await call(edge, "POST", "/admin/tenants/acme/keys", {})
    status, answer, _ = await call(edge, "POST", path.format(key_id=created["key_id"]), body)
    assert (status, answer["error"]["param"]) == (400, param)


async def test_null_key_limits_and_expiry_mean_none(edge: RunningEdge) -> None:
    await call(edge, "POST", "/admin/tenants", {"tenant_id": "acme"})
    body = {"limits": None, "expires_in_s": None}
    status, created, _ = await call(edge, "POST", "/admin/tenants/acme/keys", body)
    assert (status, created["limits"], created["expires_ms"]) == (201, None, None)


async def raw_post(
    edge: RunningEdge, path: str, data: bytes, encoding: str, token: str = TEST_ADMIN_TOKEN
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Encoding": encoding}
    async with (
        aiohttp.ClientSession() as http,
        http.post(edge.admin_url + path, data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.json(), dict(resp.headers)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_is_not_in_its_content_encoding_is_400_without_a_traceback(
    edge: RunningEdge, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = b'{"tenant_id": "acme"}'
    status, answer, _ = await raw_post(edge, "/admin/tenants", body, encoding)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["code"] == "invalid_content_encoding"
    assert f"could not be decoded with Content-Encoding '{encoding}'" in answer["error"]["message"]
    # Refused before its body is read (no admin token): aiohttp drains it, and must not fail.
    status, _, _ = await raw_post(edge, "/admin/tenants", body, encoding, token="x" * 20)
    assert status == 401
    assert [r for r in caplog.records if r.exc_info] == []
    # The same body, compressed as it says, is taken.
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    status, created, _ = await raw_post(edge, "/admin/tenants", packed, encoding)
    assert (status, created["tenant_id"]) == (201, "acme")


async def test_an_unsupported_content_encoding_is_415_naming_the_supported_ones(
    edge: RunningEdge,
) -> None:
    status, answer, headers = await raw_post(edge, "/admin/tenants", b"{}", "br")
    assert status == 415
    assert answer["error"]["message"] == (
        "unsupported Content-Encoding 'br'; supported: gzip, deflate, identity"
    )
    assert answer["error"]["code"] == "unsupported_content_encoding"
    assert headers["Accept-Encoding"] == "gzip, deflate, identity"


async def test_keys_are_created_rotated_and_revoked(edge: RunningEdge) -> None:
    await call(edge, "POST", "/admin/tenants", {"tenant_id": "acme"})
    status, created, headers = await call(
        edge, "POST", "/admin/tenants/acme/keys", {"name": "ci", "limits": {"rpm": 5}}
    )
    assert status == 201
    assert headers["Cache-Control"] == "no-store"
    raw, key_id = created["key"], created["key_id"]
    assert (await edge.server.auth.verify(raw)).key.key_id == key_id
    status, listed, _ = await call(edge, "GET", "/admin/tenants/acme/keys")
    assert [k["key_id"] for k in listed["keys"]] == [key_id]
    assert "key" not in listed["keys"][0]
    status, rotated, _ = await call(edge, "POST", f"/admin/keys/{key_id}/rotate", {"grace_s": 60})
    assert status == 201
    assert rotated["replaces"]["expires_ms"] is not None
    assert rotated["limits"] == {"rpm": 5, "tpm": None, "max_streams": None}
    await edge.server.auth.verify(raw)  # within the grace period
    await edge.server.auth.verify(rotated["key"])  # cached now
    seen = edge.counters.auth_invalidations
    status, revoked, _ = await call(edge, "DELETE", f"/admin/keys/{rotated['key_id']}")
    assert status == 200
    assert revoked["revoked_ms"] is not None
    await eventually(lambda: edge.counters.auth_invalidations > seen)  # pub/sub, not the TTL
    with pytest.raises(AuthenticationFailed):
        await edge.server.auth.verify(rotated["key"])
    status, _, _ = await call(edge, "POST", "/admin/tenants/ghost/keys", {})
    assert status == 404


async def test_stats_show_counters_and_gauges(edge: RunningEdge) -> None:
    status, stats, _ = await call(edge, "GET", "/admin/stats")
    assert status == 200
    assert stats["counters"]["admitted"] == 0
    assert set(stats["gauges"]) >= {"connections", "streams", "live_leases", "draining"}


async def cli(edge: RunningEdge, *args: str, token: str = TEST_ADMIN_TOKEN) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.edge.tenancy",
        "--admin-url",
        edge.admin_url,
        *args,
        env={**os.environ, "MERIDIAN_ADMIN_TOKEN": token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_manages_tenants_and_keys(edge: RunningEdge) -> None:
    code, out, _ = await cli(edge, "tenant", "create", "acme", "--tier", "high", "--rpm", "30")
    assert code == 0
    assert json.loads(out)["limits"]["rpm"] == 30
    code, out, _ = await cli(edge, "tenant", "update", "acme", "--tpm", "900", "--region", "jp")
    tenant = json.loads(out)
    assert tenant["limits"] == {"rpm": 30, "tpm": 900, "max_streams": None}
    assert tenant["allowed_regions"] == ["jp"]
    code, out, _ = await cli(edge, "key", "create", "acme", "--name", "laptop")
    created = json.loads(out)
    assert (await edge.server.auth.verify(created["key"])).tenant.tenant_id == "acme"
    code, out, _ = await cli(edge, "key", "revoke", created["key_id"])
    assert code == 0
    assert json.loads(out)["revoked_ms"] is not None
    code, out, _ = await cli(edge, "key", "list", "acme")
    assert [k["key_id"] for k in json.loads(out)["keys"]] == [created["key_id"]]


async def test_the_cli_reports_errors_on_stderr(edge: RunningEdge) -> None:
    code, out, err = await cli(edge, "tenant", "list", token="not-the-admin-token")
    assert (code, out) == (1, "")
    assert "HTTP 401" in err
    code, _, err = await cli(edge, "tenant", "get", "ghost")
    assert code == 1
    assert "no tenant" in err


@pytest.mark.parametrize("url", ["notaurl", "ftp://edge:9090", "http://"])
def test_the_cli_refuses_an_admin_url_that_is_not_http(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_keys_parser().parse_args(["--admin-url", url, "tenant", "list"])
    assert exited.value.code == 2
    assert "--admin-url" in capsys.readouterr().err


@pytest.mark.parametrize("grace", ["nan", "inf", "-1"])
def test_the_cli_refuses_a_grace_that_is_not_a_finite_non_negative_number(
    grace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_keys_parser().parse_args(["key", "rotate", "abc", "--grace-s", grace])
    assert exited.value.code == 2
    assert "--grace-s" in capsys.readouterr().err


def test_the_cli_names_an_admin_token_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.edge.tenancy.cli import main

    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe")
    assert main(["--admin-token-file", str(token), "tenant", "list"]) == 1
    err = capsys.readouterr().err
    assert f"--admin-token-file {token}" in err
    assert "not UTF-8" in err
    assert "Traceback" not in err


async def test_a_hung_redis_makes_the_admin_api_503_not_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stopped (SIGSTOP: connections accepted, nothing answered): the admin API says
    503 with Retry-After, as the console does — it was a 500 and a traceback."""
    server = RedisProcess(tmp_path / "redis")
    server.start()
    edge = await start_edge(redis_url=server.url, router_address=f"127.0.0.1:{free_port()}")
    try:
        assert (await call(edge, "GET", "/admin/tenants"))[0] == 200
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            status, body, headers = await call(edge, "GET", "/admin/tenants")
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert status == 503, body
        assert body["error"]["type"] == "service_unavailable"
        assert int(headers["Retry-After"]) >= 1
        assert [r for r in caplog.records if r.exc_info] == []
    finally:
        await edge.stop()
        server.stop()


@pytest.mark.parametrize(
    ("body", "shown"),
    [(b"null", "HTTP 404: Not Found"), (b'{"error": "no such thing"}', "HTTP 404: no such thing")],
)
async def test_the_cli_names_an_error_from_a_server_that_is_not_meridian(
    body: bytes, shown: str
) -> None:
    """A proxy or another service on the admin URL: its JSON error is shown as it is (it was
    "HTTP 404: None", or an AttributeError for a string "error")."""
    import aiohttp
    from aiohttp import web

    from services.edge.tenancy.cli import AdminClient, AdminError

    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=404, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/admin/tenants", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            client = AdminClient(session, f"http://127.0.0.1:{port}", "token")
            with pytest.raises(AdminError, match=shown):
                await client.call("GET", "/admin/tenants")
    finally:
        await runner.cleanup()
