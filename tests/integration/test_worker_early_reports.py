"""A nearly full worker tells its routers at once when a request ends (they refuse work near
saturation, so a stale "full" report would turn away requests it has room for); a worker with
room to spare keeps its report period."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpcutil import insecure_channel
from services.edge.upstream.worker_pool import GenerateCall
from services.worker.main import build_parser
from services.worker.service import EARLY_REPORT_LOAD, WorkerService
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import RunningWorker, start_worker
from tests.support.wait import eventually

PERIOD_MS = 5_000  # far longer than any wait below: an early report cannot be the periodic one
MODEL = "meridian-sim"
LoadReports = grpc.aio.UnaryStreamCall[worker_pb2.WatchLoadRequest, worker_pb2.LoadReport]


@pytest.fixture
async def worker() -> AsyncIterator[RunningWorker]:
    # Four batch slots; requests that run for most of a minute unless cancelled.
    engine = SimEngine(SimConfig(max_num_seqs=4, output_len_min=8_000, output_len_max=8_000))
    running = await start_worker(engine, worker_id="w1", region="kr")
    yield running
    await running.stop()


async def busy(stub: worker_pb2_grpc.WorkerStub, n: int) -> list[GenerateCall]:
    """Start ``n`` long requests and wait until each has produced a token."""
    calls: list[GenerateCall] = []
    for i in range(n):
        call: GenerateCall = stub.Generate(
            worker_pb2.GenerateRequest(
                request_id=f"r{i}",
                model=MODEL,
                messages=[worker_pb2.ChatMessage(role="user", content="keep going")],
                sampling=worker_pb2.SamplingParams(max_tokens=8_000, ignore_eos=True),
            )
        )
        await call.read()
        calls.append(call)
    return calls


async def next_report(reports: LoadReports, timeout_s: float) -> worker_pb2.LoadReport | None:
    try:
        report = await asyncio.wait_for(reports.read(), timeout_s)
    except TimeoutError:
        return None
    assert isinstance(report, worker_pb2.LoadReport)
    return report


async def test_a_full_worker_reports_freed_capacity_before_its_period(
    worker: RunningWorker,
) -> None:
    async with insecure_channel(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        calls = await busy(stub, 4)
        reports = stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_ms=PERIOD_MS))
        first = await next_report(reports, 2.0)
        assert first is not None
        assert first.running == 4
        assert first.max_running == 4

        calls[0].cancel()
        early = await next_report(reports, 2.0)
        assert early is not None, "no report until the period: routers still see a full worker"
        assert early.running == 3
        for call in calls[1:]:
            call.cancel()
        reports.cancel()


async def test_requests_ending_together_push_one_early_report(worker: RunningWorker) -> None:
    async with insecure_channel(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        calls = await busy(stub, 4)
        reports = stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_ms=PERIOD_MS))
        assert await next_report(reports, 2.0) is not None

        for call in calls:
            call.cancel()
        await eventually(lambda: worker.service.inflight == 0, timeout_s=2.0)
        early = await next_report(reports, 2.0)
        assert early is not None
        assert early.running == 0
        # The next report sent was no longer near saturation: nothing more until the period.
        assert await next_report(reports, 1.0) is None
        reports.cancel()


async def test_a_worker_with_room_keeps_its_report_period(worker: RunningWorker) -> None:
    async with insecure_channel(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        calls = await busy(stub, 1)  # 1 of 4 slots: a stale report changes no routing decision
        reports = stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_ms=PERIOD_MS))
        first = await next_report(reports, 2.0)
        assert first is not None
        assert first.running == 1

        calls[0].cancel()
        await eventually(lambda: worker.service.inflight == 0, timeout_s=2.0)
        assert await next_report(reports, 1.0) is None
        reports.cancel()


def test_the_early_report_load_must_be_a_fraction() -> None:
    engine = SimEngine(SimConfig())
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="early_report_load"):
            WorkerService(engine=engine, worker_id="w", region="kr", early_report_load=bad)


def test_the_worker_cli_takes_the_early_report_load_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["--worker-id", "w1", "--region", "kr"]
    assert build_parser().parse_args(base).early_report_load == EARLY_REPORT_LOAD
    assert (
        build_parser().parse_args([*base, "--early-report-load", "0.75"]).early_report_load == 0.75
    )
    for bad in ("1.5", "-1", "half"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*base, "--early-report-load", bad])
        assert "--early-report-load" in capsys.readouterr().err
