"""A stream continued on another worker over the real gRPC service (what the edge's migration
sends: the request again, with the delivered token ids, text count and tail), here for a
stream that ``min_tokens`` keeps going past the model's natural end: the worker it ran on dies
mid-stream (as kill -9 looks), and the continuation on another worker is byte-identical to an
uninterrupted stream — it was refused ("resume.delivered_token_ids already reach this
request's end"), since the sim judged the end by the natural length alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpcutil import insecure_channel
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import RunningWorker, start_worker

MODEL = "meridian-sim"
TOKENS = 400


def request(request_id: str, *, min_tokens: int = TOKENS) -> worker_pb2.GenerateRequest:
    r = worker_pb2.GenerateRequest(request_id=request_id, model=MODEL)
    r.messages.add(role="user", content="tell me a long story")
    r.sampling.max_tokens = TOKENS
    r.sampling.min_tokens = min_tokens
    r.sampling.seed = 11
    r.sampling.logprobs = True
    r.sampling.top_logprobs = 2
    return r


def engine() -> SimEngine:
    # The natural end falls within 8..24 tokens: min_tokens keeps every stream going past it.
    return SimEngine(
        SimConfig(models=(MODEL,), time_scale=0.2, output_len_min=8, output_len_max=24)
    )


@pytest.fixture
async def workers() -> AsyncIterator[tuple[RunningWorker, RunningWorker]]:
    first = await start_worker(engine(), worker_id="kr-1", region="kr")
    second = await start_worker(engine(), worker_id="kr-2", region="kr")
    yield first, second
    await first.die()
    await second.stop()


def text(chunks: list[worker_pb2.GenerateChunk]) -> str:
    return "".join(c.text for c in chunks)


def ids(chunks: list[worker_pb2.GenerateChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def logprobs(chunks: list[worker_pb2.GenerateChunk]) -> list[bytes]:
    return [lp.SerializeToString() for c in chunks for lp in c.logprobs]


async def generate(address: str, r: worker_pb2.GenerateRequest) -> list[worker_pb2.GenerateChunk]:
    async with insecure_channel(address) as channel:
        return [c async for c in worker_pb2_grpc.WorkerStub(channel).Generate(r)]


async def read_rest(
    call: AsyncIterator[worker_pb2.GenerateChunk], into: list[worker_pb2.GenerateChunk]
) -> None:
    async for chunk in call:
        into.append(chunk)


@pytest.mark.parametrize(
    ("min_tokens", "finish", "total"),
    [
        (TOKENS, worker_pb2.FINISH_REASON_LENGTH, TOKENS),
        (TOKENS - 50, worker_pb2.FINISH_REASON_STOP, TOKENS - 49),
    ],
)
async def test_a_stream_min_tokens_keeps_past_its_natural_end_moves_byte_identically(
    workers: tuple[RunningWorker, RunningWorker], min_tokens: int, finish: int, total: int
) -> None:
    first, second = workers
    reference = await generate(second.address, request("ref", min_tokens=min_tokens))
    assert reference[-1].finish_reason == finish
    assert reference[-1].usage.completion_tokens == total

    # The same request (same seed) on the first worker, which dies mid-stream.
    delivered: list[worker_pb2.GenerateChunk] = []
    async with insecure_channel(first.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(request("r", min_tokens=min_tokens))
        async for chunk in call:
            delivered.append(chunk)
            if len(ids(delivered)) >= 200:  # far past the natural end
                break
        await first.die()
        with pytest.raises(grpc.aio.AioRpcError):  # cut mid-stream, not ended
            await read_rest(call, delivered)
    assert not any(c.finish_reason for c in delivered)
    assert ids(delivered) == ids(reference)[: len(ids(delivered))]

    # What the edge sends the next worker (services/edge/migration/resume.py).
    resumed = request("r.m1", min_tokens=min_tokens)
    resumed.resume.delivered_token_ids.extend(ids(delivered))
    resumed.resume.delivered_text_chars = len(text(delivered))
    resumed.resume.delivered_text_tail = text(delivered)[-256:]
    resumed.resume.origin_request_id = "r"
    resumed.resume.migrations = 1
    rest = await generate(second.address, resumed)

    assert text(delivered) + text(rest) == text(reference)
    assert ids(delivered) + ids(rest) == ids(reference)
    assert logprobs(delivered) + logprobs(rest) == logprobs(reference)
    assert rest[-1].finish_reason == finish
    assert rest[-1].usage.completion_tokens == total
    assert rest[-1].usage.prompt_tokens == reference[-1].usage.prompt_tokens
