"""TLS termination with a generated self-signed pair: protocol floor, suites, errors."""

from __future__ import annotations

import asyncio
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from services.edge.counters import EdgeCounters
from services.edge.guard import GuardConfig, Occupancy
from services.edge.protocol import Listener
from services.edge.selfsigned import write_self_signed
from services.edge.tls import TlsConfig, server_context


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "edge.crt", folder / "edge.key"
    write_self_signed(cert, key)
    return cert, key


def test_the_generated_pair_names_local_hosts_and_keeps_its_key_private(
    pair: tuple[Path, Path],
) -> None:
    cert_file, key_file = pair
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_unreadable_certificates_are_named_in_the_error(tmp_path: Path) -> None:
    missing = TlsConfig(cert_file=tmp_path / "nope.crt", key_file=tmp_path / "nope.key")
    with pytest.raises(ValueError, match=r"nope\.crt"):
        server_context(missing)
    with pytest.raises(ValueError, match="min_version"):
        TlsConfig(cert_file=tmp_path / "a", key_file=tmp_path / "b", min_version="1.0")


@asynccontextmanager
async def https(pair: tuple[Path, Path], min_version: str = "1.2") -> AsyncIterator[int]:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/ok", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    config = GuardConfig()
    listener = Listener(
        server=runner.server,
        host="127.0.0.1",
        port=0,
        ssl_context=server_context(
            TlsConfig(cert_file=pair[0], key_file=pair[1], min_version=min_version)
        ),
        config=config,
        connections=Occupancy(max_total=10, max_per_ip=10),
        counters=EdgeCounters(),
    )
    port = await listener.start()
    try:
        yield port
    finally:
        listener.close()
        await runner.cleanup()


def client_context(cert: Path, *, highest: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cert))
    if highest is not None:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = highest
    return ctx


async def handshake(port: int, ctx: ssl.SSLContext) -> tuple[str | None, str | None, bytes]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
    )
    tls = writer.get_extra_info("ssl_object")
    writer.write(b"GET /ok HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    return tls.version(), tls.cipher()[0], answer


async def test_tls_13_is_negotiated_by_a_modern_client(pair: tuple[Path, Path]) -> None:
    async with https(pair) as port:
        version, _, answer = await handshake(port, client_context(pair[0]))
    assert version == "TLSv1.3"
    assert answer.startswith(b"HTTP/1.1 200")


async def test_tls_12_clients_get_a_forward_secret_aead_suite(pair: tuple[Path, Path]) -> None:
    async with https(pair) as port:
        version, cipher, _ = await handshake(
            port, client_context(pair[0], highest=ssl.TLSVersion.TLSv1_2)
        )
    assert version == "TLSv1.2"
    assert cipher is not None
    assert cipher.startswith("ECDHE-")
    assert "GCM" in cipher or "CHACHA20" in cipher


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    ("floor", "client_max"),
    [("1.2", ssl.TLSVersion.TLSv1_1), ("1.3", ssl.TLSVersion.TLSv1_2)],
)
async def test_protocols_below_the_floor_are_refused(
    pair: tuple[Path, Path], floor: str, client_max: ssl.TLSVersion
) -> None:
    async with https(pair, min_version=floor) as port:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake(port, client_context(pair[0], highest=client_max))


async def test_plain_http_on_the_tls_port_gets_no_http_answer(pair: tuple[Path, Path]) -> None:
    async with https(pair) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = await asyncio.wait_for(reader.read(), 5.0)
        except ConnectionError:
            answer = b""
        writer.close()
    assert not answer.startswith(b"HTTP/")
