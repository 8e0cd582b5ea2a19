"""What one gRPC message per token costs, and what multiplexing would save (issue 15).

    .venv/bin/python -m bench.token_framing [--streams 8 32 128] [--tokens 64] [--repeats 3]
        [--variants a b c d] [--window-s 2] [--warmup-s 1] [--no-sink]

Two real processes on 127.0.0.1, both ``grpc.aio`` on uvloop like the services: a server
standing in for the worker and a client standing in for the edge (plus a sink process standing
in for the edge's HTTP clients, not measured). S streams run concurrently and back to back
(a stream that ends is replaced at once), each emitting ``--tokens`` tokens, one every 10 ms on
an ideal timeline (one timer per token, like ``bench.fake_openai``), with a random phase per
stream. Variants, all on the same workload:

  a  today: one server-streaming RPC per stream, one ``GenerateChunk`` per token;
  b  one server-streaming RPC per stream; the handler merges every token of its stream that
     is pending when its previous write completes into one chunk (no timer);
  c  one bidi stream per client-server pair, multiplexed: the tokens every stream produces
     in one event-loop iteration go out as one ``Frame`` (repeated stream id + chunk; the
     flush is scheduled with ``loop.call_soon``, no timer); the client demultiplexes frames
     into per-stream asyncio queues read by one consumer task per stream, as the edge's
     handler would be; opening a stream (and cancelling one) is a message on the same call;
  d  c with an engine-step clock: every stream emits in lockstep every 10 ms, as all running
     sequences of one vLLM engine step do;
  a-step  a with the engine-step clock (what today's design costs on vLLM's timing).

Every consumer writes what it receives to its own TCP connection to the sink (one write per
message received, as the edge writes one SSE event per chunk), so the write cost the edge pays
to its HTTP client is in every variant; ``--no-sink`` drops it.

Measured over ``--window-s`` after ``--warmup-s``: CPU (utime + stime of the whole process,
every thread, from /proc/<pid>/stat) per token delivered, in each process; delivery latency
(server emit → client consumer; a token's id *is* its emit time in µs of CLOCK_MONOTONIC,
which is system-wide on Linux); messages server → client per token; tokens/s delivered as a
share of what was offered. Each (variant, S) runs ``--repeats`` times in alternating order on
fresh processes; the table shows medians (min–max of CPU in brackets).

The frame messages are defined at run time (a descriptor built here and added to the default
pool, importing ``meridian/v1/worker.proto``), not in proto/: this is an experiment.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue
from typing import Any

import grpc
import uvloop
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench._cpu import cpu_seconds
from meridian.v1 import worker_pb2
from services.common import cli
from services.common.grpcutil import insecure_channel, new_server

ITL_S = 0.010
TEXT = " tok"
SERVICE = "/meridian.bench.framing.Framing/"
VARIANTS = ("a", "b", "c", "d", "a-step")
STEP_CLOCK = {"d", "a-step"}
MUX = {"c", "d"}
LABELS = {
    "a": "(a) RPC per stream, message per token",
    "b": "(b) RPC per stream, merge pending",
    "c": "(c) one bidi stream, frame per loop iteration",
    "d": "(d) = c, lockstep engine step",
    "a-step": "(a') = a, lockstep engine step",
}
SSE_HEAD = b'data: {"choices":[{"index":0,"delta":{"content":"'
SSE_TAIL = b'"}}]}\n\n'
U32 = 0xFFFFFFFF


# --- the bench-only frame messages --------------------------------------------------------


def _frame_classes() -> tuple[Any, Any, Any]:
    """``Entry``, ``Frame`` and ``Control``, built as a descriptor importing worker.proto."""
    pool = descriptor_pool.Default()
    name = "meridian/bench/framing.proto"
    try:
        fd = pool.FindFileByName(name)
    except KeyError:
        f = descriptor_pb2.FileDescriptorProto(
            name=name, package="meridian.bench.framing", syntax="proto3"
        )
        f.dependency.append(worker_pb2.DESCRIPTOR.name)
        t = descriptor_pb2.FieldDescriptorProto
        entry = f.message_type.add(name="Entry")
        entry.field.add(name="stream", number=1, type=t.TYPE_UINT64, label=t.LABEL_OPTIONAL)
        entry.field.add(
            name="chunk",
            number=2,
            type=t.TYPE_MESSAGE,
            label=t.LABEL_OPTIONAL,
            type_name=".meridian.v1.GenerateChunk",
        )
        frame = f.message_type.add(name="Frame")
        frame.field.add(
            name="entries",
            number=1,
            type=t.TYPE_MESSAGE,
            label=t.LABEL_REPEATED,
            type_name=".meridian.bench.framing.Entry",
        )
        control = f.message_type.add(name="Control")
        control.field.add(name="stream", number=1, type=t.TYPE_UINT64, label=t.LABEL_OPTIONAL)
        control.field.add(
            name="open",
            number=2,
            type=t.TYPE_MESSAGE,
            label=t.LABEL_OPTIONAL,
            type_name=".meridian.v1.GenerateRequest",
        )
        control.field.add(name="cancel", number=3, type=t.TYPE_BOOL, label=t.LABEL_OPTIONAL)
        pool.Add(f)
        fd = pool.FindFileByName(name)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(fd.message_types_by_name[m])
        for m in ("Entry", "Frame", "Control")
    )


Entry, Frame, Control = _frame_classes()

# A stream's tokens not yet sent: (text, token id) each, and whether the last one ends it.
Pending = dict[int, tuple[list[tuple[str, int]], bool]]


def build_frame(pending: Pending) -> Any:
    """One ``Frame`` for everything pending: one entry per stream, its tokens merged."""
    frame = Frame()
    for stream, (tokens, last) in pending.items():
        entry = frame.entries.add()
        entry.stream = stream
        fill_chunk(entry.chunk, tokens, last)
    return frame


def fill_chunk(chunk: worker_pb2.GenerateChunk, tokens: list[tuple[str, int]], last: bool) -> None:
    """A chunk carrying ``tokens`` (text concatenated, ids in order), final if ``last``."""
    if len(tokens) == 1:
        chunk.text = tokens[0][0]
        chunk.token_ids.append(tokens[0][1])
    else:
        chunk.text = "".join(t for t, _ in tokens)
        chunk.token_ids.extend(i for _, i in tokens)
    if last:
        chunk.finish_reason = worker_pb2.FINISH_REASON_LENGTH


def demux(frame: Any, queues: dict[int, asyncio.Queue[worker_pb2.GenerateChunk]]) -> int:
    """Hands each entry's chunk to its stream's queue; returns how many had no stream (a
    stream the client already cancelled or finished: its tokens are dropped)."""
    orphans = 0
    for entry in frame.entries:
        q = queues.get(entry.stream)
        if q is None:
            orphans += 1
        else:
            q.put_nowait(entry.chunk)
    return orphans


# --- server (the worker's stand-in) -------------------------------------------------------


def now_us() -> int:
    return int(time.monotonic() * 1e6) & U32


class Engine:
    """Emits tokens for open streams: one timer per token on an ideal timeline with a random
    phase per stream, or (``step``) one timer per 10 ms emitting for every stream at once.
    A token's id is its emit time (µs of CLOCK_MONOTONIC, mod 2**32)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, step: bool, seed: int) -> None:
        self._loop = loop
        self._step = step
        self._rng = random.Random(seed)
        self._live: dict[object, list[Any]] = {}  # key -> [tokens left, emit]
        self._ticking = False

    def open(self, key: object, tokens: int, emit: Callable[[str, int, bool], None]) -> None:
        state = [tokens, emit]
        self._live[key] = state
        if self._step:
            if not self._ticking:  # the engine's clock runs from the first stream on
                self._ticking = True
                due = self._loop.time() + ITL_S
                self._loop.call_at(due, self._tick, due)
        else:
            first = self._loop.time() + self._rng.uniform(0, ITL_S)
            self._loop.call_at(first, self._emit_one, key, state, first)

    def close(self, key: object) -> None:
        """Stops a stream early (the call was cancelled); no-op for a finished one."""
        self._live.pop(key, None)

    def _emit_one(self, key: object, state: list[Any], due: float) -> None:
        if self._live.get(key) is not state:
            return
        state[0] -= 1
        last = state[0] <= 0
        if last:
            del self._live[key]
        state[1](TEXT, now_us(), last)
        if not last:
            self._loop.call_at(due + ITL_S, self._emit_one, key, state, due + ITL_S)

    def _tick(self, due: float) -> None:
        t = now_us()
        done = []
        for key, state in self._live.items():
            state[0] -= 1
            last = state[0] <= 0
            state[1](TEXT, t, last)
            if last:
                done.append(key)
        for key in done:
            del self._live[key]
        self._loop.call_at(due + ITL_S, self._tick, due + ITL_S)


class MuxSession:
    """One client's bidi call: tokens from any stream are collected until the end of the
    current loop iteration (``call_soon``), then written as one frame; tokens that arrive
    while a write is in flight join the next frame."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: Pending = {}
        self._scheduled = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, stream: int, text: str, token_id: int, last: bool) -> None:
        held = self._pending.get(stream)
        if held is None:
            self._pending[stream] = ([(text, token_id)], last)
        else:
            held[0].append((text, token_id))
            if last:
                self._pending[stream] = (held[0], True)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def write_frames(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        while True:
            if not self._pending:
                self._waiter = self._loop.create_future()
                await self._waiter
            frame = build_frame(self._pending)
            self._pending = {}
            await context.write(frame)


class Framing:
    """The server's three handlers; which clock the engine runs is fixed per process."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def per_token(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        q: asyncio.Queue[tuple[str, int, bool]] = asyncio.Queue()
        key = object()
        self.engine.open(key, request.sampling.max_tokens, lambda *t: q.put_nowait(t))
        try:
            while True:
                text, token_id, last = await q.get()
                chunk = worker_pb2.GenerateChunk(text=text, token_ids=(token_id,))
                if last:
                    chunk.finish_reason = worker_pb2.FINISH_REASON_LENGTH
                yield chunk
                if last:
                    return
        finally:
            self.engine.close(key)

    async def merged(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        q: asyncio.Queue[tuple[str, int, bool]] = asyncio.Queue()
        key = object()
        self.engine.open(key, request.sampling.max_tokens, lambda *t: q.put_nowait(t))
        try:
            while True:
                text, token_id, last = await q.get()
                tokens = [(text, token_id)]
                while not q.empty():  # what came while the previous write was in flight
                    text, token_id, last = q.get_nowait()
                    tokens.append((text, token_id))
                chunk = worker_pb2.GenerateChunk()
                fill_chunk(chunk, tokens, last)
                yield chunk
                if last:
                    return
        finally:
            self.engine.close(key)

    async def mux(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        loop = asyncio.get_running_loop()
        session = MuxSession(loop)
        keys: dict[int, object] = {}

        async def read_controls() -> None:
            async for ctl in requests:
                if ctl.cancel:
                    key = keys.pop(ctl.stream, None)
                    if key is not None:
                        self.engine.close(key)
                    continue
                key = keys[ctl.stream] = object()
                stream = ctl.stream

                def emit(text: str, token_id: int, last: bool, stream: int = stream) -> None:
                    if last:
                        keys.pop(stream, None)
                    session.push(stream, text, token_id, last)

                self.engine.open(key, ctl.open.sampling.max_tokens, emit)

        reader = asyncio.create_task(read_controls())
        writer = asyncio.create_task(session.write_frames(context))
        try:
            await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            writer.cancel()
            for key in keys.values():
                self.engine.close(key)

    def handler(self) -> grpc.GenericRpcHandler:
        ser = worker_pb2.GenerateChunk.SerializeToString
        req = worker_pb2.GenerateRequest.FromString
        return grpc.method_handlers_generic_handler(
            SERVICE.strip("/").rsplit("/", 1)[0],
            {
                "PerToken": grpc.unary_stream_rpc_method_handler(
                    self.per_token, request_deserializer=req, response_serializer=ser
                ),
                "Merged": grpc.unary_stream_rpc_method_handler(
                    self.merged, request_deserializer=req, response_serializer=ser
                ),
                "Mux": grpc.stream_stream_rpc_method_handler(
                    self.mux,
                    request_deserializer=Control.FromString,
                    response_serializer=Frame.SerializeToString,
                ),
            },
        )


def serve_process(step: bool, seed: int, ports: Connection) -> None:
    async def serve() -> None:
        engine = Engine(asyncio.get_running_loop(), step, seed)
        server = new_server()
        server.add_generic_rpc_handlers((Framing(engine).handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.send(port)  # a pipe, not a Queue: no feeder thread left in the process
        ports.close()
        await server.wait_for_termination()

    uvloop.run(serve())


# --- sink (the edge's HTTP clients; not measured) -----------------------------------------


class Discard(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        pass


def sink_process(ports: Connection) -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Discard, "127.0.0.1", 0, backlog=1024)
        ports.send(server.sockets[0].getsockname()[1])
        ports.close()
        await asyncio.Event().wait()

    uvloop.run(serve())


# --- client (the edge's stand-in) ---------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """CPU time of one process, every thread: the sum of its threads' ``schedstat`` run time
    (ns), since utime + stime in ``/proc/<pid>/stat`` count 10 ms ticks, too coarse for a
    2 s window at 8 streams (one tick = 6 µs/token); falls back to them without schedstat."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (FileNotFoundError, ProcessLookupError):
        return cpu_seconds([pid])


@dataclass
class Tally:
    measuring: bool = False
    tokens: int = 0
    messages: int = 0
    orphans: int = 0
    writes: int = 0  # sink writes (one SSE event each)
    latencies_us: list[int] = field(default_factory=list)

    def received(self, chunk: worker_pb2.GenerateChunk, arrived_us: int, rpc: bool) -> None:
        """One chunk reached its stream's consumer (``rpc``: as its own gRPC message)."""
        if self.measuring:
            self.messages += rpc
            self.writes += 1
            self.tokens += len(chunk.token_ids)
            self.latencies_us.extend((arrived_us - i) & U32 for i in chunk.token_ids)


def sse(chunk: worker_pb2.GenerateChunk) -> bytes:
    return SSE_HEAD + chunk.text.encode() + SSE_TAIL


@dataclass
class ClientArgs:
    variant: str
    streams: int
    tokens: int
    port: int
    sink_port: int
    server_pid: int
    warmup_s: float
    window_s: float


async def open_sinks(args: ClientArgs) -> list[asyncio.StreamWriter | None]:
    if not args.sink_port:
        return [None] * args.streams
    out: list[asyncio.StreamWriter | None] = []
    for _ in range(args.streams):
        _, w = await asyncio.open_connection("127.0.0.1", args.sink_port)
        out.append(w)
    return out


def request(tokens: int, n: int) -> worker_pb2.GenerateRequest:
    r = worker_pb2.GenerateRequest(request_id=f"r{n}", model="bench")
    r.sampling.max_tokens = tokens
    return r


async def rpc_lane(
    channel: grpc.aio.Channel,
    method: str,
    args: ClientArgs,
    sink: asyncio.StreamWriter | None,
    tally: Tally,
    lane: int,
) -> None:
    """One stream after another, each its own server-streaming RPC (variants a, b)."""
    call = channel.unary_stream(
        SERVICE + method,
        request_serializer=worker_pb2.GenerateRequest.SerializeToString,
        response_deserializer=worker_pb2.GenerateChunk.FromString,
    )
    n = 0
    while True:
        n += 1
        async for chunk in call(request(args.tokens, lane * 1_000_000 + n)):
            tally.received(chunk, now_us(), rpc=True)
            if sink is not None:
                sink.write(sse(chunk))


async def mux_client(
    channel: grpc.aio.Channel,
    args: ClientArgs,
    sinks: list[asyncio.StreamWriter | None],
    tally: Tally,
) -> None:
    """One bidi call; a reader demultiplexes frames, one consumer task per stream (variants
    c, d). A consumer takes everything its queue holds and writes it as one event."""
    call = channel.stream_stream(
        SERVICE + "Mux",
        request_serializer=Control.SerializeToString,
        response_deserializer=Frame.FromString,
    )()
    queues: dict[int, asyncio.Queue[worker_pb2.GenerateChunk]] = {}
    controls: asyncio.Queue[Any] = asyncio.Queue()

    async def send_controls() -> None:
        while True:
            await call.write(await controls.get())

    async def read_frames() -> None:
        while True:
            frame = await call.read()
            if frame is grpc.aio.EOF:
                return
            if tally.measuring:
                tally.messages += 1
            tally.orphans += demux(frame, queues)

    async def lane(i: int, sink: asyncio.StreamWriter | None) -> None:
        n = 0
        while True:
            n += 1
            stream = i * 1_000_000 + n
            q: asyncio.Queue[worker_pb2.GenerateChunk] = asyncio.Queue()
            queues[stream] = q
            controls.put_nowait(Control(stream=stream, open=request(args.tokens, stream)))
            done = False
            while not done:
                chunk = await q.get()
                if not q.empty():  # several entries for this stream: one event for all
                    merged = worker_pb2.GenerateChunk()
                    merged.MergeFrom(chunk)
                    while not q.empty():
                        merged.MergeFrom(q.get_nowait())
                    chunk = merged
                tally.received(chunk, now_us(), rpc=False)
                if sink is not None:
                    sink.write(sse(chunk))
                done = chunk.finish_reason != worker_pb2.FINISH_REASON_UNSPECIFIED
            del queues[stream]

    tasks = [asyncio.create_task(send_controls()), asyncio.create_task(read_frames())]
    tasks += [asyncio.create_task(lane(i, s)) for i, s in enumerate(sinks)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        call.cancel()


async def run_client(args: ClientArgs) -> dict[str, Any]:
    sinks = await open_sinks(args)
    channel = insecure_channel(f"127.0.0.1:{args.port}")
    await channel.channel_ready()
    tally = Tally()
    if args.variant in MUX:
        tasks = [asyncio.create_task(mux_client(channel, args, sinks, tally))]
    else:
        method = "Merged" if args.variant == "b" else "PerToken"
        tasks = [
            asyncio.create_task(rpc_lane(channel, method, args, sinks[i], tally, i))
            for i in range(args.streams)
        ]
    await asyncio.sleep(args.warmup_s)
    me = os.getpid()
    server0, client0, t0 = process_cpu_s(args.server_pid), process_cpu_s(me), time.monotonic()
    tally.measuring = True
    await asyncio.sleep(args.window_s)
    tally.measuring = False
    server1, client1, t1 = process_cpu_s(args.server_pid), process_cpu_s(me), time.monotonic()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()
    for w in sinks:
        if w is not None:
            w.close()
    lat = sorted(tally.latencies_us)
    tokens = max(1, tally.tokens)
    return {
        "server_us": (server1 - server0) * 1e6 / tokens,
        "client_us": (client1 - client0) * 1e6 / tokens,
        "p50_ms": pct(lat, 0.50) / 1000,
        "p99_ms": pct(lat, 0.99) / 1000,
        "msgs_per_token": tally.messages / tokens,
        "writes_per_token": tally.writes / tokens,
        "delivered": tally.tokens / ((t1 - t0) * args.streams / ITL_S),
        "tokens": tally.tokens,
        "orphans": tally.orphans,
    }


def client_process(args: ClientArgs, results: Queue[dict[str, Any]]) -> None:
    results.put(uvloop.run(run_client(args)))


def pct(ordered: Sequence[int], q: float) -> float:
    if not ordered:
        return float("nan")
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


# --- orchestration ------------------------------------------------------------------------


def recv(conn: Connection, timeout_s: float) -> int:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"a benchmark process did not start within {timeout_s:g} s")
    port: int = conn.recv()
    return port


def run_one(
    variant: str, streams: int, opts: argparse.Namespace, sink_port: int, seed: int
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    ports, ports_in = ctx.Pipe(duplex=False)
    results: Queue[dict[str, Any]] = ctx.Queue()
    server = ctx.Process(
        target=serve_process, args=(variant in STEP_CLOCK, seed, ports_in), daemon=True
    )
    server.start()
    client = None
    try:
        port = recv(ports, 60)
        assert server.pid is not None
        args = ClientArgs(
            variant=variant,
            streams=streams,
            tokens=opts.tokens,
            port=port,
            sink_port=sink_port,
            server_pid=server.pid,
            warmup_s=opts.warmup_s,
            window_s=opts.window_s,
        )
        client = ctx.Process(target=client_process, args=(args, results), daemon=True)
        client.start()
        return results.get(timeout=60 + opts.warmup_s + opts.window_s)
    finally:
        for p in (client, server):
            if p is not None:
                p.terminate()
                p.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.token_framing", description=__doc__)
    p.add_argument("--streams", type=cli.positive_int, nargs="+", default=[8, 32, 128])
    p.add_argument("--tokens", type=cli.positive_int, default=64)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--repeats", type=cli.positive_int, default=3)
    p.add_argument("--warmup-s", type=cli.positive_float, default=1.0)
    p.add_argument("--window-s", type=cli.positive_float, default=2.0)
    p.add_argument("--seed", type=cli.integer(0), default=1)
    p.add_argument(
        "--no-sink",
        dest="sink",
        action="store_false",
        help="consumers do not write each message to a TCP socket",
    )
    opts = p.parse_args(argv)
    if opts.tokens < 1 or opts.repeats < 1 or min(opts.streams) < 1:
        p.error("--tokens, --repeats and --streams must be at least 1")
    if opts.window_s <= 0 or opts.warmup_s < 0:
        p.error("--window-s must be > 0 and --warmup-s >= 0")

    print(
        f"# token_framing: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}; load average "
        f"{os.getloadavg()[0]:.2f}; T={opts.tokens} tokens/stream, one per 10 ms; "
        f"sink {'on' if opts.sink else 'off'}; window {opts.window_s:g} s, "
        f"{opts.repeats} repeats",
        flush=True,
    )
    ctx = multiprocessing.get_context("spawn")
    sink = None
    sink_port = 0
    if opts.sink:
        sink_ports, sink_ports_in = ctx.Pipe(duplex=False)
        sink = ctx.Process(target=sink_process, args=(sink_ports_in,), daemon=True)
        sink.start()
        sink_port = recv(sink_ports, 60)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        cells = [(v, s) for s in opts.streams for v in opts.variants]
        for r in range(opts.repeats):
            for v, s in cells if r % 2 == 0 else reversed(cells):
                res = run_one(v, s, opts, sink_port, opts.seed + r)
                runs.setdefault((v, s), []).append(res)
                print(
                    f"  run {r + 1} {v:>6} S={s:<4} server {res['server_us']:6.1f} "
                    f"client {res['client_us']:6.1f} µs/token, p50 {res['p50_ms']:.2f} "
                    f"p99 {res['p99_ms']:.2f} ms, {res['msgs_per_token']:.3f} msg "
                    f"{res['writes_per_token']:.3f} writes/token, "
                    f"{res['delivered']:.0%} delivered, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        if sink is not None:
            sink.terminate()
            sink.join(10)

    print()
    print(
        "| variant | S | server CPU µs/token | client CPU µs/token | latency p50 / p99 ms "
        "| gRPC messages/token | sink writes/token | delivered |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for s in opts.streams:
        for v in opts.variants:
            rs = runs[(v, s)]

            def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
                return float(statistics.median(x[k] for x in rs))

            def span(k: str, rs: list[dict[str, Any]] = rs) -> str:
                return f"{min(x[k] for x in rs):.0f}–{max(x[k] for x in rs):.0f}"

            print(
                f"| {LABELS[v]} | {s} | {med('server_us'):.0f} ({span('server_us')}) "
                f"| {med('client_us'):.0f} ({span('client_us')}) "
                f"| {med('p50_ms'):.2f} / {med('p99_ms'):.2f} | {med('msgs_per_token'):.3f} "
                f"| {med('writes_per_token'):.3f} | {med('delivered'):.0%} |"
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
