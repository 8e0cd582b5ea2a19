"""``make run`` with ``MERIDIAN_GRPC_TLS=1`` (``--grpc-tls``): real processes, mutual TLS on
every internal hop, and a worker that refuses a caller without the stack's certificate."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from services.localstack.config import load_stack_config, parse_stack_config
from services.localstack.stack import REPO_ROOT, LocalStack

pytestmark = pytest.mark.slow


async def test_the_local_stack_serves_over_mutual_tls_and_workers_refuse_plaintext(
    tmp_path: Path,
) -> None:
    base = load_stack_config(REPO_ROOT / "deploy/local/stack.yaml")
    config = parse_stack_config(
        {"model": base.model, "regions": {"kr": {"rtt_ms": 2, "workers": 1}}}
    )
    stack = LocalStack(config=config, run_dir=tmp_path / "run", edge_port=0, grpc_tls=True)
    await stack.start()
    try:
        ep = stack.endpoints
        assert ep.grpc_tls_ca
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{ep.edge_url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {ep.demo_key}"},
                json={
                    "model": ep.model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["usage"]["completion_tokens"] == 3

        (worker,) = ep.workers.values()
        certs = Path(ep.grpc_tls_ca).parent

        async def health(*flags: str) -> int:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.common.healthcheck",
                "grpc",
                worker.direct,
                *flags,
                stderr=asyncio.subprocess.DEVNULL,
            )
            return await proc.wait()

        assert await health() == 1  # plaintext: refused
        router_files = ["--grpc-tls-cert", str(certs / "router.crt")]
        router_files += ["--grpc-tls-key", str(certs / "router.key")]
        assert await health(*router_files, "--grpc-tls-ca", ep.grpc_tls_ca) == 0
    finally:
        await stack.stop()
