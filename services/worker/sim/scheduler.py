"""The simulator's core: continuous batching over a KV cache, as pure synchronous steps.

No asyncio, no sleeping, no clock: every call takes ``now`` (clock seconds), so tests drive it
deterministically and :class:`~services.worker.sim.engine.SimEngine` drives it in real time.
A step has two halves, because tokens exist only when the GPU step is over:

``begin_step(now)`` chooses the batch and returns a :class:`StepPlan` with the step's duration;
``end_step(now)`` (at ``now + duration``) makes the tokens and returns one output per sequence
that produced one. ``abort`` may come in between: the sequence leaves at once, its KV blocks are
freed at once, and its share of the step is discarded. ``step(now)`` does both halves.

Scheduling follows vLLM's v1 scheduler:

1. Running sequences first, in priority order (higher ``priority`` first, then arrival). Each
   takes what it still has to compute (one token when decoding, the rest of its prompt when
   prefilling), limited by the step's token budget (``max_num_batched_tokens``). When the KV
   cache has no block for it, the *last* running sequence in that order (lowest priority,
   newest) is preempted: its blocks are freed and it goes back to the waiting queue to be
   recomputed later (its registered blocks often survive in the prefix cache, making that
   cheap). If the sequence needing the block is itself the last, it is the one preempted.
2. If nothing was preempted, waiting sequences are admitted in priority-then-FIFO order while
   the batch has fewer than ``max_num_seqs``, the budget lasts and the KV cache can hold the
   tokens scheduled now (the prefix-cache hits are shared, not computed). The head of the
   queue blocks the rest (no overtaking, as in vLLM).
3. Step time (:meth:`step_cost_ms`) = ``decode_base_ms + decode_ms_per_seq * batch +
   prefill_ms_per_token * prompt tokens computed``, times ``time_scale``.
4. At the end of the step every sequence that has computed all its tokens samples one more
   (so a new request's first token comes after its prefill); finished sequences free their KV.

``load(now)`` reports the batch, the queue, KV usage (blocks held / total), and over the last
``stats_window_s``: generated tokens per second, the prefix-cache hit rate (hit tokens /
looked-up tokens at admission) and one simulated GPU whose utilization is the fraction of the
window spent in steps (what NVML's utilization means: time a kernel was running).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.errors import InvalidRequest, Overloaded
from services.worker.engine import EngineLoad, EngineOutput, EngineRequest, GpuStat
from services.worker.sim.config import SimConfig
from services.worker.sim.kv import KvCache
from services.worker.sim.sequence import SeqState, SimSequence
from services.worker.sim.stats import WindowedSum
from services.worker.sim.validation import build_sequence

OVERLOAD_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one engine step computes and how long it takes (seconds, ``time_scale`` applied)."""

    started_at: float
    duration_s: float
    batch_size: int
    decode_seqs: int
    prefill_tokens: int
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StepResult:
    plan: StepPlan
    finished_at: float
    outputs: Mapping[str, EngineOutput]


def _queue_key(seq: SimSequence) -> tuple[int, int]:
    return (-seq.priority, seq.order)


class SimScheduler:
    """Continuous batching for one simulated engine. See the module docstring."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.kv = KvCache(
            num_blocks=config.num_kv_blocks,
            block_size=config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self._seqs: dict[str, SimSequence] = {}
        self._waiting: list[SimSequence] = []  # sorted by _queue_key
        self._running: list[SimSequence] = []
        self._work: list[tuple[SimSequence, int]] = []
        self._plan: StepPlan | None = None
        self._order = 0
        self._generated = WindowedSum(config.stats_window_s)
        self._hit_tokens = WindowedSum(config.stats_window_s)
        self._query_tokens = WindowedSum(config.stats_window_s)
        self._busy_s = WindowedSum(config.stats_window_s)

    # -- requests -----------------------------------------------------------------------------

    def add(self, request: EngineRequest, now: float) -> SimSequence:
        """Validate and queue ``request`` (see :mod:`.validation` for the errors)."""
        seq = build_sequence(request, self.config, arrival=now, order=self._order)
        if seq.request_id in self._seqs:
            raise InvalidRequest(
                f"request_id {seq.request_id!r} is already in flight", param="request_id"
            )
        limit = self.config.max_waiting
        if limit is not None and len(self._waiting) >= limit:
            raise Overloaded(
                f"the admission queue is full ({limit} waiting)",
                retry_after_s=OVERLOAD_RETRY_AFTER_S,
            )
        self._order += 1
        self._seqs[seq.request_id] = seq
        bisect.insort(self._waiting, seq, key=_queue_key)
        return seq

    def check(self, request: EngineRequest) -> None:
        """Validate ``request`` without queueing it (raises what :meth:`add` would)."""
        build_sequence(request, self.config, arrival=0.0, order=0)

    def abort(self, request_id: str, now: float) -> EngineOutput | None:
        """Remove the request now and free its KV. Returns its final (``abort``) output, or
        None if it is not in flight (finished, aborted already, never added)."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        if seq.state is SeqState.WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            self.kv.free(seq.blocks)
            seq.blocks = []
        seq.state = SeqState.FINISHED
        return seq.abort_output(now)

    def get(self, request_id: str) -> SimSequence | None:
        return self._seqs.get(request_id)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def in_step(self) -> bool:
        return self._plan is not None

    def request_ids(self) -> list[str]:
        return list(self._seqs)

    # -- steps --------------------------------------------------------------------------------

    def step_cost_ms(self, *, batch_size: int, prefill_tokens: int) -> float:
        c = self.config
        ms = c.decode_base_ms + c.decode_ms_per_seq * batch_size
        return (ms + c.prefill_ms_per_token * prefill_tokens) * c.time_scale

    def begin_step(self, now: float) -> StepPlan | None:
        """Choose this step's batch. None when there is nothing to compute."""
        if self._plan is not None:
            raise RuntimeError("begin_step called twice without end_step")
        budget = self.config.max_num_batched_tokens
        work: list[tuple[SimSequence, int]] = []
        preempted: list[str] = []

        order = sorted(self._running, key=_queue_key)
        while len(work) < len(order) and budget > 0:
            seq = order[len(work)]
            n = min(seq.remaining, budget)
            need = self.kv.blocks_for(seq.num_computed + n) - len(seq.blocks)
            while need > self.kv.free_blocks:
                victim = order.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is seq:
                    break
            else:
                seq.blocks.extend(self.kv.allocate(need))
                work.append((seq, n))
                budget -= n

        admitted: list[str] = []
        if not preempted:
            while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
                n = self._admit(self._waiting[0], budget, now)
                if n == 0:
                    break
                seq = self._waiting.pop(0)
                work.append((seq, n))
                admitted.append(seq.request_id)
                budget -= n

        if not work:
            return None
        decode_seqs = sum(1 for seq, _ in work if seq.is_decoding)
        prefill_tokens = sum(n for seq, n in work if not seq.is_decoding)
        duration = self.step_cost_ms(batch_size=len(work), prefill_tokens=prefill_tokens) / 1e3
        self._work = work
        self._plan = StepPlan(
            started_at=now,
            duration_s=duration,
            batch_size=len(work),
            decode_seqs=decode_seqs,
            prefill_tokens=prefill_tokens,
            admitted=tuple(admitted),
            preempted=tuple(preempted),
        )
        return self._plan

    def end_step(self, now: float) -> dict[str, EngineOutput]:
        """Finish the step begun last: compute, sample, finish. One output per sequence that
        sampled a token; sequences aborted during the step are skipped."""
        if self._plan is None:
            raise RuntimeError("end_step called without begin_step")
        plan, work, self._work, self._plan = self._plan, self._work, [], None
        self._busy_s.add(now, plan.duration_s)
        outputs: dict[str, EngineOutput] = {}
        for seq, n in work:
            if seq.state is not SeqState.RUNNING:
                continue
            seq.num_computed += n
            self._register_full_blocks(seq)
            if seq.num_computed < seq.num_tokens:
                continue  # a chunk of a long prefill; no token yet
            outputs[seq.request_id] = seq.append_token(now)
            if seq.finish_reason is not None:
                self._finish(seq)
        self._generated.add(now, len(outputs))
        return outputs

    def step(self, now: float) -> StepResult | None:
        """Both halves at once: the step starts at ``now`` and ends ``duration_s`` later."""
        plan = self.begin_step(now)
        if plan is None:
            return None
        end = now + plan.duration_s
        return StepResult(plan=plan, finished_at=end, outputs=self.end_step(end))

    # -- load ---------------------------------------------------------------------------------

    def load(self, now: float) -> EngineLoad:
        queried = self._query_tokens.total(now)
        hits = self._hit_tokens.total(now)
        window = self.config.stats_window_s
        gpu = GpuStat(
            index=0,
            utilization=min(1.0, self._busy_s.total(now) / window),
            memory_used_fraction=self.config.gpu_memory_utilization,
        )
        return EngineLoad(
            running=len(self._running),
            waiting=len(self._waiting),
            max_running=self.config.max_num_seqs,
            kv_cache_usage=self.kv.usage,
            tokens_per_second=self._generated.total(now) / window,
            prefix_cache_hit_rate=hits / queried if queried > 0 else 0.0,
            gpus=(gpu,),
        )

    # -- internals ----------------------------------------------------------------------------

    def _admit(self, seq: SimSequence, budget: int, now: float) -> int:
        """Move ``seq``'s first chunk into the KV cache; the number of tokens scheduled, or 0
        when it does not fit now (budget without chunking, or KV blocks)."""
        bs = self.config.block_size
        hits: list[int] = []
        if self.kv.prefix_caching:
            # At least one token must be computed, to have logits to sample from.
            hashes = seq.full_block_hashes(bs)[: (seq.num_tokens - 1) // bs]
            hits = self.kv.lookup(hashes)
        cached = len(hits) * bs
        todo = seq.num_tokens - cached
        n = min(todo, budget)
        if n < todo and not self.config.chunked_prefill:
            return 0
        new_blocks = self.kv.blocks_for(cached + n) - len(hits)
        if not self.kv.can_take(hits, new_blocks):
            return 0
        self.kv.share(hits)
        seq.blocks = [*hits, *self.kv.allocate(new_blocks)]
        seq.num_computed = cached
        seq.registered = len(hits)
        seq.state = SeqState.RUNNING
        self._running.append(seq)
        if seq.first_scheduled_at is None:
            seq.first_scheduled_at = max(now, seq.arrival)
        if seq.cached_prompt_tokens is None:
            seq.cached_prompt_tokens = min(cached, len(seq.prompt_ids))
        if self.kv.prefix_caching:
            self._query_tokens.add(now, seq.num_tokens)
            self._hit_tokens.add(now, cached)
        return n

    def _preempt(self, seq: SimSequence) -> None:
        self._running.remove(seq)
        self.kv.free(seq.blocks)
        seq.reset_for_recompute()
        bisect.insort(self._waiting, seq, key=_queue_key)

    def _finish(self, seq: SimSequence) -> None:
        self._running.remove(seq)
        self.kv.free(seq.blocks)
        seq.blocks = []
        seq.state = SeqState.FINISHED
        del self._seqs[seq.request_id]

    def _register_full_blocks(self, seq: SimSequence) -> None:
        if not self.kv.prefix_caching:
            return
        full = seq.num_computed // self.config.block_size
        if full <= seq.registered:
            return
        hashes = seq.full_block_hashes(self.config.block_size)
        for i in range(seq.registered, full):
            self.kv.register(seq.blocks[i], hashes[i])
        seq.registered = full
