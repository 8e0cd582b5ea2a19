"""``python -m services.worker`` on SIGTERM with long-lived streams open: every deploy does
this, with each router holding a WatchLoad stream and each edge a GenerateMux call.

The streams end cleanly (status OK; the load stream's last report says draining, the streams
in flight are handed off), the process exits 0, and everything it writes is JSON lines with
nothing at error level and no traceback. Before, ``server.stop`` cancelled the open WatchLoad
stream and the event loop closed under its handler: an error line ("Exception not handled by
_handle_exceptions in servicer method [/meridian.v1.Worker/WatchLoad]") and a raw traceback on
stderr on every deploy, and every watcher saw the stream cut (UNAVAILABLE), not ended.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpcutil import insecure_channel
from services.localstack.stack import REPO_ROOT
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

MODEL = "meridian-sim"


def request(request_id: str) -> worker_pb2.GenerateRequest:
    """A stream far longer than the drain's grace: the drain hands it off."""
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        model=MODEL,
        messages=[worker_pb2.ChatMessage(role="user", content=request_id)],
        sampling=worker_pb2.SamplingParams(max_tokens=5000, ignore_eos=True, seed=1),
    )


async def watch(stub: worker_pb2_grpc.WorkerStub, reports: list[worker_pb2.LoadReport]) -> None:
    async for report in stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_ms=20)):
        reports.append(report)


async def mux(stub: worker_pb2_grpc.WorkerStub, events: list[worker_pb2.MuxEvent]) -> None:
    done_writing = asyncio.Event()

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        yield worker_pb2.MuxRequest(
            stream_id=1, open=worker_pb2.MuxOpen(request=request("mux-1"), window=10_000)
        )
        await done_writing.wait()  # the edge keeps its side open

    try:
        async for frame in stub.GenerateMux(requests()):
            events.extend(frame.events)
    finally:
        done_writing.set()


async def generate(
    stub: worker_pb2_grpc.WorkerStub, chunks: list[worker_pb2.GenerateChunk]
) -> None:
    async for chunk in stub.Generate(request("call-1")):
        chunks.append(chunk)


async def test_sigterm_with_streams_open_ends_them_cleanly_and_logs_only_json(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.worker", "--worker-id", "w1", "--region", "kr",
        "--port", "0", "--ready-file", str(ready), "--drain-grace-s", "0.3",
        "--report-interval-ms", "20", cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    output = asyncio.ensure_future(proc.communicate())
    try:
        await eventually(ready.exists, timeout_s=60, interval_s=0.05)
        port = json.loads(ready.read_text())["port"]
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            watches: list[list[worker_pb2.LoadReport]] = [[] for _ in range(4)]
            events: list[worker_pb2.MuxEvent] = []
            chunks: list[worker_pb2.GenerateChunk] = []
            streams = [asyncio.ensure_future(watch(stub, reports)) for reports in watches]
            streams.append(asyncio.ensure_future(mux(stub, events)))
            streams.append(asyncio.ensure_future(generate(stub, chunks)))
            await eventually(
                lambda: all(len(r) >= 2 for r in watches) and bool(events) and bool(chunks),
                timeout_s=30,
            )
            proc.send_signal(signal.SIGTERM)
            ended = await asyncio.wait_for(
                asyncio.gather(*streams, return_exceptions=True), timeout=30
            )
        out, err = await asyncio.wait_for(output, timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    assert proc.returncode == 0
    assert out == b""
    lines = err.decode().splitlines()
    assert lines
    assert "Traceback" not in err.decode()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a line that is not JSON: {line!r}\n{err.decode()}")
    assert not [r for r in records if r["level"] in ("warning", "error", "critical")], records
    assert records[-1]["event"] == "worker.stopped"

    # Every stream ended with status OK, none was cut.
    assert ended == [None] * len(streams), ended
    for reports in watches:
        assert reports[-1].draining  # the last report a router sees says why it ends
    assert events[-2].chunk.handoff
    assert events[-1].HasField("end")
    assert events[-1].end.code == grpc.StatusCode.OK.value[0]
    assert chunks[-1].handoff
