"""``--engine openai`` against a real OpenAI-compatible HTTP server on 127.0.0.1 (an aiohttp
app in the test's loop, tests/support/openai_upstream.py): models at start-up, streaming with
the upstream's usage and finish reasons, errors mapped, cancellation seen by the upstream,
load, and the whole edge → router → worker path in front of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common import telemetry
from services.common.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    Unavailable,
    UpstreamFailed,
)
from services.common.logs import JsonFormatter
from services.common.net import free_port
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelState,
    SamplingOptions,
)
from services.worker.server import WorkerConfig, WorkerServer
from services.worker.upstream.config import UpstreamConfig
from services.worker.upstream.engine import UpstreamEngine, UpstreamStartError
from tests.support.inproc import start_edge, start_router, start_worker, stop_all
from tests.support.openai_upstream import FakeUpstream
from tests.support.wait import eventually

HELLO = (ChatTurn(role="user", content="Hello"),)


def request(rid: str = "r1", model: str = "up-model", **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model=model,
        messages=HELLO,
        sampling=SamplingOptions(**sampling),  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def running(upstream: FakeUpstream, **config: object) -> AsyncIterator[UpstreamEngine]:
    engine = UpstreamEngine(UpstreamConfig(base_url=upstream.base_url, **config))  # type: ignore[arg-type]
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


async def collect(engine: UpstreamEngine, req: EngineRequest) -> list[EngineOutput]:
    async with contextlib.aclosing(engine.generate(req)) as outs:
        return [o async for o in outs]


async def test_streams_text_with_the_upstreams_usage_and_finish_reason() -> None:
    async with FakeUpstream(tokens=5, prompt_tokens=13) as up, running(up) as engine:
        outs = await collect(engine, request(max_tokens=5, temperature=0.0, stop=["END"]))
    assert "".join(o.text for o in outs) == "t0 t1 t2 t3 t4 "
    assert [o.finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert outs[-1].completion_tokens == 5
    assert outs[-1].prompt_tokens == 13
    sent = up.received[0].body
    assert sent["model"] == "up-model"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["temperature"], sent["stop"]) == (5, 0.0, ["END"])
    assert "ignore_eos" not in sent  # only sent when asked for
    assert up.received[0].headers["x-request-id"] == "r1"


async def test_a_natural_end_is_stop_and_logprobs_are_passed_on() -> None:
    async with FakeUpstream(tokens=3, logprobs=True) as up, running(up) as engine:
        outs = await collect(engine, request(logprobs=True, top_logprobs=1))
    assert outs[-1].finish_reason is FinishReason.STOP
    logprobs = [lp for o in outs for lp in o.logprobs]
    assert [lp.token for lp in logprobs] == ["t0 ", "t1 ", "t2 "]
    assert logprobs[0].top == (("t0 ", -0.5),)
    assert up.received[0].body["top_logprobs"] == 1


async def test_a_server_without_usage_still_ends_with_counted_tokens() -> None:
    async with FakeUpstream(tokens=4, send_usage=False) as up, running(up) as engine:
        outs = await collect(engine, request())
    assert outs[-1].finish_reason is FinishReason.STOP
    assert outs[-1].completion_tokens == 4


async def test_a_slow_reader_gets_merged_outputs_with_every_token_in_order() -> None:
    async with FakeUpstream(tokens=200) as up, running(up) as engine:
        outs: list[EngineOutput] = []
        async with contextlib.aclosing(engine.generate(request())) as stream:
            async for out in stream:
                outs.append(out)
                await asyncio.sleep(0.01)  # the upstream runs ahead meanwhile
    assert "".join(o.text for o in outs) == "".join(f"t{i} " for i in range(200))
    assert len(outs) < 200  # several tokens per output once behind
    assert outs[-1].completion_tokens == 200


async def test_closing_the_stream_closes_the_upstream_connection() -> None:
    async with FakeUpstream(tokens=1000, interval_s=0.01) as up, running(up) as engine:
        async with contextlib.aclosing(engine.generate(request())) as stream:
            async for out in stream:
                if out.text:
                    break
        await asyncio.wait_for(up.disconnected.wait(), 5.0)
        assert engine.in_flight() == frozenset()
        assert engine.load().running == 0


async def test_cancelling_the_consumer_closes_the_upstream_connection() -> None:
    async with FakeUpstream(tokens=1000, interval_s=0.01) as up, running(up) as engine:
        task = asyncio.ensure_future(collect(engine, request()))
        await asyncio.wait_for(up.streaming.wait(), 5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(up.disconnected.wait(), 5.0)
        assert engine.in_flight() == frozenset()


async def test_abort_ends_the_stream_with_abort_and_disconnects_upstream() -> None:
    async with FakeUpstream(tokens=1000, interval_s=0.01) as up, running(up) as engine:
        outs: list[EngineOutput] = []
        async with contextlib.aclosing(engine.generate(request("a1"))) as stream:
            async for out in stream:
                outs.append(out)
                if len(outs) == 2:
                    await engine.abort("a1")
        assert outs[-1].finish_reason is FinishReason.ABORT
        await asyncio.wait_for(up.disconnected.wait(), 5.0)


async def test_an_upstream_that_cuts_the_stream_fails_the_request() -> None:
    async with FakeUpstream(tokens=10, cut_after=3) as up, running(up) as engine:
        with pytest.raises(UpstreamFailed):
            await collect(engine, request())
        assert engine.in_flight() == frozenset()


@pytest.mark.parametrize(
    ("status", "payload", "error", "param"),
    [
        (
            400,
            {"error": {"message": "bad temp", "param": "temperature"}},
            InvalidRequest,
            "temperature",
        ),
        (
            400,
            {"error": {"message": "This model's maximum context length is 2048 tokens"}},
            ContextLengthExceeded,
            None,
        ),
        (404, {"error": {"message": "no such model"}}, ModelNotFound, "model"),
        (429, {"error": {"message": "slow down"}}, Overloaded, None),
        (503, {"error": {"message": "overloaded"}}, Unavailable, None),
    ],
)
async def test_upstream_refusals_become_meridian_errors(
    status: int, payload: dict[str, object], error: type[Exception], param: str | None
) -> None:
    async with FakeUpstream(fail_with=(status, payload)) as up, running(up) as engine:
        with pytest.raises(error) as info:
            await collect(engine, request())
    assert getattr(info.value, "param", None) == param
    assert engine.in_flight() == frozenset()


LONG_TALK = (
    ChatTurn(role="system", content="be brief now"),
    ChatTurn(role="user", content=" ".join(["old"] * 30)),
    ChatTurn(role="assistant", content=" ".join(["answer"] * 10)),
    ChatTurn(role="user", content=" ".join(["new"] * 20)),
)


def long_talk(*, truncate: bool) -> EngineRequest:
    return EngineRequest(
        request_id="r1",
        model="up-model",
        messages=LONG_TALK,
        sampling=SamplingOptions(max_tokens=3),
        truncate_oldest=truncate,
    )


async def test_truncation_drops_the_oldest_turns_the_upstreams_tokenizer_counts() -> None:
    """A conversation the upstream refuses for its length goes again without its oldest
    turns — as few as its /tokenize says make it fit — and the first output says how many."""
    async with FakeUpstream(tokens=3, context_words=50) as up, running(up) as engine:
        outs = await collect(engine, long_talk(truncate=True))
        assert outs[0].dropped_messages == 2
        assert [o.dropped_messages for o in outs[1:]] == [0] * (len(outs) - 1)
        assert outs[-1].finish_reason is FinishReason.LENGTH
        refused, served = (r.body["messages"] for r in up.received)
        assert len(refused) == 4
        assert served == [
            {"role": "system", "content": "be brief now"},
            {"role": "user", "content": " ".join(["new"] * 20)},
        ]
        assert 2 <= up.tokenized <= 3  # the whole, then a bisection over two user starts


async def test_without_truncation_or_a_tokenizer_the_upstreams_refusal_stands() -> None:
    async with FakeUpstream(context_words=50) as up, running(up) as engine:
        with pytest.raises(ContextLengthExceeded):
            await collect(engine, long_talk(truncate=False))
        assert (len(up.received), up.tokenized) == (1, 0)
    async with FakeUpstream(context_words=50, tokenize=False) as up, running(up) as engine:
        with pytest.raises(ContextLengthExceeded) as refused:
            await collect(engine, long_talk(truncate=True))
        assert "POST /tokenize" in refused.value.message
        assert "maximum context length is 50" in refused.value.message
        assert len(up.received) == 1


async def test_an_unknown_model_is_refused_before_anything_is_sent() -> None:
    async with FakeUpstream() as up, running(up) as engine:
        with pytest.raises(ModelNotFound) as info:
            await collect(engine, request(model="other"))
    assert info.value.param == "model"
    assert up.received == []


async def test_models_come_from_the_upstream_and_can_be_renamed() -> None:
    models: list[dict[str, object]] = [
        {"id": "a", "object": "model", "max_model_len": 4096},
        {"id": "b", "object": "model"},
    ]
    async with FakeUpstream(models=models) as up:
        async with running(up) as engine:
            assert {(m.name, m.max_model_len) for m in engine.models()} == {("a", 4096), ("b", 0)}
            assert {m.state for m in engine.models()} == {ModelState.READY}
        async with running(up, upstream_model="b", served_model_name="bee") as engine:
            assert [m.name for m in engine.models()] == ["bee"]
            await collect(engine, request(model="bee"))
        assert up.received[-1].body["model"] == "b"


async def test_start_names_the_flag_when_the_upstream_does_not_answer() -> None:
    engine = UpstreamEngine(
        UpstreamConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", start_wait_s=0.3)
    )
    with pytest.raises(
        UpstreamStartError, match=r"--upstream-url http://127\.0\.0\.1:.*does not answer"
    ):
        await engine.start()
    assert engine.state is ModelState.FAILED
    with pytest.raises(Unavailable):
        await collect(engine, request())
    await engine.shutdown()


async def test_start_names_upstream_model_when_the_upstream_lacks_it() -> None:
    async with FakeUpstream() as up:
        engine = UpstreamEngine(UpstreamConfig(base_url=up.base_url, upstream_model="nope"))
        with pytest.raises(UpstreamStartError, match=r"--upstream-model nope.*up-model"):
            await engine.start()
        await engine.shutdown()


async def test_the_api_key_is_sent_and_a_refused_key_names_its_flag() -> None:
    async with FakeUpstream(api_key="sk-upstream") as up:
        async with running(up, api_key="sk-upstream") as engine:
            await collect(engine, request())
        assert up.received[0].headers["authorization"] == "Bearer sk-upstream"
        engine = UpstreamEngine(UpstreamConfig(base_url=up.base_url, api_key="wrong"))
        with pytest.raises(UpstreamStartError, match="--upstream-api-key-file"):
            await engine.start()
        await engine.shutdown()


async def test_load_counts_streams_in_flight_and_reads_vllm_metrics() -> None:
    metrics = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="up-model"} 7.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="up-model"} 3.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="up-model"} 0.25\n'
    )
    async with (
        FakeUpstream(tokens=1000, interval_s=0.01, metrics_text=metrics) as up,
        running(up, max_concurrency=2, scrape_interval_s=0.05) as engine,
    ):
        streams = [asyncio.ensure_future(collect(engine, request(f"r{i}"))) for i in range(3)]
        await eventually(lambda: engine.load().kv_cache_usage == 0.25 and engine.load().waiting > 3)
        load = engine.load()
        assert load.max_running == 2
        assert load.running == 7  # the upstream's own count is larger than our 2
        assert load.waiting == 3 + 1  # its queue plus the one waiting here for a slot
        for s in streams:
            s.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


async def test_the_whole_path_serves_the_upstream_through_edge_and_router(redis_url: str) -> None:
    async with FakeUpstream(tokens=6, prompt_tokens=9) as up:
        engine = UpstreamEngine(UpstreamConfig(base_url=up.base_url))
        worker = await start_worker(engine, worker_id="kr-up-1", region="kr")
        router = await start_router([worker.address])
        edge = await start_edge(redis_url=redis_url, router_address=router.address)
        try:
            await router.wait_healthy(1)
            key = await edge.new_key()
            async with openai.AsyncOpenAI(
                base_url=f"{edge.url}/v1", api_key=key, max_retries=0
            ) as api:
                stream = await api.chat.completions.create(
                    model="up-model",
                    messages=[{"role": "user", "content": "Hi"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "t0 t1 t2 t3 t4 t5 "
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 6
            assert chunks[-1].usage.prompt_tokens == 9
        finally:
            await stop_all(edge, router, worker)


async def test_worker_grpc_cancel_reaches_the_upstream() -> None:
    async with FakeUpstream(tokens=1000, interval_s=0.01) as up:
        worker = await start_worker(
            UpstreamEngine(UpstreamConfig(base_url=up.base_url)), worker_id="w1", region="kr"
        )
        try:
            async with grpc.aio.insecure_channel(worker.address) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                req = worker_pb2.GenerateRequest(request_id="g1", model="up-model")
                req.messages.add(role="user", content="Hi")
                call = stub.Generate(req)
                async for chunk in call:
                    if chunk.text:
                        break
                call.cancel()
            await asyncio.wait_for(up.disconnected.wait(), 5.0)
            await eventually(lambda: worker.service.inflight == 0)
        finally:
            await worker.stop()


class _JsonLines(logging.Handler):
    """Formats each record as it is logged (the trace id is read then, from the live span)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@dataclass
class Observed:
    """What one Generate through a worker in front of ``up`` left behind."""

    chunks: list[worker_pb2.GenerateChunk]
    spans: dict[str, ReadableSpan]
    metrics: bytes
    log: list[dict[str, object]]


async def generate_observed(
    up: FakeUpstream, req: worker_pb2.GenerateRequest, *, logger: str
) -> Observed:
    """``req`` over gRPC to a worker with telemetry, the ``logger``'s JSON lines captured."""
    lines = _JsonLines()
    log = logging.getLogger(logger)
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    spans = InMemorySpanExporter()
    tel = telemetry.setup("worker", env={}, span_exporter=spans)
    server = WorkerServer(
        config=WorkerConfig(worker_id="w1", region="kr", stop_grace_s=0.0),
        engine=UpstreamEngine(UpstreamConfig(base_url=up.base_url)),
        telemetry=tel,
    )
    await server.start()
    try:
        await server.wait_loaded()
        async with grpc.aio.insecure_channel(server.address) as channel:
            chunks = [c async for c in worker_pb2_grpc.WorkerStub(channel).Generate(req)]
    finally:
        await server.stop()
        log.removeHandler(lines)
        log.setLevel(logging.NOTSET)
    exported = tel.prometheus_text()
    tel.shutdown()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    return Observed(chunks, by_name, exported, lines.lines)


async def test_the_upstream_hop_has_a_span_metrics_and_a_log_line_with_the_trace_id() -> None:
    async with FakeUpstream(tokens=3) as up:
        req = worker_pb2.GenerateRequest(request_id="t1", model="up-model")
        req.messages.add(role="user", content="Hi")
        seen = await generate_observed(up, req, logger="meridian.worker.upstream")
    assert seen.chunks[-1].usage.completion_tokens == 3
    hop, generate = seen.spans["worker.upstream"], seen.spans["worker.Generate"]
    assert hop.parent is not None
    assert hop.parent.span_id == generate.context.span_id
    assert hop.attributes is not None
    assert hop.attributes["meridian.outcome"] == "ok"
    trace_id = format(hop.context.trace_id, "032x")
    span_id = format(hop.context.span_id, "016x")
    assert up.received[0].headers["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert b"meridian_worker_upstream_requests_total" in seen.metrics
    (done,) = [line for line in seen.log if line["event"] == "upstream.done"]
    assert done["trace_id"] == trace_id
    assert done["outcome"] == "ok"


async def test_a_truncated_prompt_has_its_span_attribute_metric_and_log_line() -> None:
    async with FakeUpstream(tokens=3, context_words=50) as up:
        req = worker_pb2.GenerateRequest(request_id="t1", model="up-model", truncate_oldest=True)
        req.sampling.max_tokens = 3
        for turn in LONG_TALK:
            req.messages.add(role=turn.role, content=turn.content)
        seen = await generate_observed(up, req, logger="meridian.worker")
    assert seen.chunks[-1].usage.completion_tokens == 3
    generate = seen.spans["worker.Generate"]
    assert generate.attributes is not None
    assert generate.attributes["meridian.prompt.dropped_messages"] == 2
    assert b"meridian_worker_dropped_messages_total" in seen.metrics
    (noted,) = [line for line in seen.log if line["event"] == "generate.truncated"]
    assert noted["trace_id"] == format(generate.context.trace_id, "032x")
    assert (noted["dropped_messages"], noted["kept_messages"]) == (2, 2)


def test_the_worker_command_line_rejects_bad_upstream_flags(tmp_path: Path) -> None:
    from services.worker.engine import EngineConfigError
    from services.worker.engine_factory import build_engine
    from services.worker.main import build_parser

    parser = build_parser()
    base = ["--engine", "openai", "--worker-id", "w", "--region", "r"]
    cases = {
        (): "--upstream-url is required",
        ("--upstream-url", "ftp://x/v1"): "--upstream-url 'ftp://x/v1': the scheme",
        ("--upstream-url", "http://u:p@x/v1"): "--upstream-url must not carry credentials",
        ("--upstream-url", "http://x:99999/v1"): "--upstream-url",
        (
            "--upstream-url",
            "http://x/v1",
            "--upstream-api-key-file",
            str(tmp_path / "missing"),
        ): "--upstream-api-key-file",
    }
    for extra, message in cases.items():
        with pytest.raises(EngineConfigError, match=message):
            build_engine(parser.parse_args([*base, *extra]))
    for timeout in ("0", "nan", "inf"):  # refused by the flag's own type: argparse's exit 2
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*base, "--upstream-url", "x", "--upstream-timeout-s", timeout])
        assert exited.value.code == 2
    for flag in ("--max-num-seqs", "--max-model-len"):  # counts: >= 1, by their types too
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*base, "--upstream-url", "http://x/v1", flag, "0"])
        assert exited.value.code == 2
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(EngineConfigError, match="the file is empty"):
        build_engine(
            parser.parse_args(
                [*base, "--upstream-url", "http://x/v1", "--upstream-api-key-file", str(empty)]
            )
        )
    keyfile = tmp_path / "key"
    keyfile.write_text("sk-abc\n")
    engine = build_engine(
        parser.parse_args(
            [*base, "--upstream-url", "http://x:8000/v1/", "--upstream-api-key-file", str(keyfile)]
        )
    )
    assert isinstance(engine, UpstreamEngine)
    assert engine.config.base_url == "http://x:8000/v1"
    assert engine.config.api_key == "sk-abc"
    assert "sk-abc" not in repr(engine.config)


async def test_a_request_waiting_for_a_slot_ends_with_abort_at_shutdown() -> None:
    async with FakeUpstream(tokens=1000, interval_s=0.01) as up:
        engine = UpstreamEngine(UpstreamConfig(base_url=up.base_url, max_concurrency=1))
        await engine.start()
        running = asyncio.ensure_future(collect(engine, request("first")))
        await asyncio.wait_for(up.streaming.wait(), 5.0)
        waiting = asyncio.ensure_future(collect(engine, request("second")))
        await eventually(lambda: engine.load().waiting == 1)
        await engine.shutdown()
        first, second = await asyncio.gather(running, waiting)
    assert first[-1].finish_reason is FinishReason.ABORT
    assert [o.finish_reason for o in second] == [FinishReason.ABORT]
    assert len(up.received) == 1  # the second never reached the upstream
