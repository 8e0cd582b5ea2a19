"""Acceptance: HTTPS works with the generated certificate (the official SDK, verifying it);
plain HTTP to the TLS port gets no answer."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from services.edge.selfsigned import write_self_signed
from services.edge.tls import TlsConfig
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN, edge_config
from tests.support.inproc import RunningEdge, start_edge


@pytest.fixture
async def tls_edge(
    stack: Stack, redis_url: str, tmp_path: Path
) -> AsyncIterator[tuple[RunningEdge, Path]]:
    cert, key = tmp_path / "edge.crt", tmp_path / "edge.key"
    write_self_signed(cert, key)
    edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(plain_http=False, tls=TlsConfig(cert_file=cert, key_file=key)),
    )
    yield edge, cert
    await edge.stop()


async def test_https_serves_the_openai_sdk_with_the_generated_certificate(
    tls_edge: tuple[RunningEdge, Path], stack: Stack
) -> None:
    edge, cert = tls_edge
    assert edge.url.startswith("https://127.0.0.1:")
    trust = ssl.create_default_context(cafile=str(cert))
    async with openai.AsyncOpenAI(
        base_url=f"{edge.url}/v1",
        api_key=stack.key,
        http_client=openai.DefaultAsyncHttpxClient(verify=trust),
        max_retries=0,
    ) as client:
        completion = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "secure hello"}], max_tokens=3
        )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3


async def test_an_untrusted_client_and_plain_http_are_both_refused(
    tls_edge: tuple[RunningEdge, Path],
) -> None:
    edge, _ = tls_edge
    plain = edge.url.replace("https://", "http://")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.get(f"{edge.url}/healthz")  # the default trust store: not ours
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"{plain}/healthz") as resp:
                await resp.read()


async def test_over_tls_the_console_cookie_is_secure_and_host_bound(
    tls_edge: tuple[RunningEdge, Path],
) -> None:
    edge, cert = tls_edge
    trust = ssl.create_default_context(cafile=str(cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as http:
        resp = await http.post(
            f"{edge.url}/console/session",
            data={"token": TEST_ADMIN_TOKEN},
            allow_redirects=False,
        )
        cookie = resp.headers["Set-Cookie"]
        assert cookie.startswith("__Host-meridian_console=")
        assert "Secure" in cookie
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        page = await http.get(f"{edge.url}/")
        assert page.headers["Strict-Transport-Security"] == "max-age=31536000"
