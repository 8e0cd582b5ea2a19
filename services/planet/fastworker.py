"""The fast worker: ``SimScheduler``'s continuous batching, leaping over runs of decode steps.

Simulating 10,000 GPUs token by token is ~10⁸ Python steps an hour. But between two events that
change a batch (an arrival, an admission, a first token, a finish, a preemption) every step of a
decoding batch costs the same — ``SimScheduler.step_cost_ms(batch_size=B, prefill_tokens=0)``,
the simulator's own cost function on the worker's own ``SimConfig`` — so ``k`` of them take
``k ·`` that. This model runs exactly the steps ``SimScheduler`` runs (same order, budget,
admission, chunked prefill and preemption rules, see its docstring) one at a time when anything
happens, and leaps over the rest:

- a *single step* whenever a sequence is prefilling, one is admitted, or the KV cache cannot
  hold the next step's blocks (preemption happens there, as in ``SimScheduler``);
- otherwise a *leap* of ``k`` decode steps, ``k`` = steps until the first sequence finishes,
  cut short so that the blocks the batch grows into stay within the free KV; an arrival during
  a leap cuts it at the end of the step in progress (``SimEngine`` admits at the next step).

``tests/unit/planet/test_fastworker.py`` runs the same requests through this model and through
``SimScheduler`` and checks every first-token and finish time is the same. KV blocks are
counted per shared prefix (:mod:`.kvmodel`), not per block, to keep 10,000 workers in memory.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from services.planet.kvmodel import Entry, PrefixKv
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler
from services.worker.sim.stats import WindowedSum


@dataclass(slots=True, eq=False)
class Job:
    """One request as the engine sees it. ``chain``: its shared prefixes, root first, as
    ``(key, full blocks of the prompt that prefix covers)``; ``extend_key``: the prefix a
    finished turn's outputs extend (its conversation)."""

    rid: int
    priority: int
    prompt: int
    target: int  # tokens to generate
    chain: tuple[tuple[object, int], ...] = ()
    extend_key: object = None
    owner: object = None  # the simulator's request
    order: int = 0
    computed: int = 0
    out: int = 0
    blocks: int = 0  # blocks held in total (private + shared)
    shared: int = 0  # of which in entries
    holds: list[Entry] = field(default_factory=list)
    registered: bool = False

    # The engine's per-step loops spell these out (prompt + out, ...): a property is a
    # Python call per job per step.
    @property
    def tokens(self) -> int:
        return self.prompt + self.out

    @property
    def remaining(self) -> int:
        return self.tokens - self.computed


def _key(j: Job) -> tuple[int, int]:
    return (-j.priority, j.order)


class _Cost:
    """Lets the simulator call ``SimScheduler.step_cost_ms`` (which reads only ``config``)
    without building a whole scheduler (its KV cache) per worker."""

    __slots__ = ("config",)

    def __init__(self, config: SimConfig) -> None:
        self.config = config


Emit = Callable[[str, Job, float], None]


class FastWorker:
    """One simulated GPU server. The simulator calls :meth:`submit`, and :meth:`wake` at
    ``next_at``; ``emit(kind, job, t)`` reports ``"first"`` tokens and ``"done"`` jobs."""

    def __init__(self, config: SimConfig, emit: Emit) -> None:
        self.config = config
        self.emit = emit
        self.bs = config.block_size
        self.kv = PrefixKv(config.num_kv_blocks)
        self.running: list[Job] = []
        self.waiting: list[Job] = []
        self.next_at = math.inf
        self.version = 0
        self._order = 0
        self._cost = _Cost(config)
        self._decode_ms: dict[int, float] = {}
        # the step or leap in progress
        self._t0 = 0.0
        self._c = 0.0
        self._k = 0
        self._work: list[tuple[Job, int]] | None = None  # a single step's work; None: a leap
        self._waking = False  # inside wake(): submissions wait for its plan
        self._generated = WindowedSum(config.stats_window_s)
        self._hits = WindowedSum(config.stats_window_s)
        self._queried = WindowedSum(config.stats_window_s)
        self._busy = WindowedSum(config.stats_window_s)

    # --- inputs --------------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        job.order = self._order
        self._order += 1
        bisect.insort(self.waiting, job, key=_key)
        if self._waking:
            return
        if self.next_at == math.inf:
            self._plan(now)
        elif self._work is None and self._k > 1:
            done = int((now - self._t0) / self._c)  # steps finished before the arrival
            if done + 1 < self._k:
                self._k = done + 1
                self._set_next(self._t0 + self._k * self._c)

    def crash(self) -> list[Job]:
        """The server dies: every job in it is lost (returned), its cache is empty."""
        lost = self.running + self.waiting
        self.running, self.waiting = [], []
        self.kv.clear()
        self._work = None
        self._set_next(math.inf)
        return lost

    def wake(self, now: float) -> None:
        """End the step or leap that ends now, then plan the next."""
        self._waking = True
        if self._work is not None:
            self._end_single(now)
        else:
            self._end_leap(self._k, now)
        self._waking = False
        self._plan(now)

    # --- load ----------------------------------------------------------------------------

    def load(self, now: float) -> tuple[int, int, float, float, float, float]:
        """``(running, waiting, kv_usage, tokens_per_second, prefix_hit_rate, gpu_util)``."""
        window = self.config.stats_window_s
        extra_tokens = 0
        extra_busy = 0.0
        used = self.kv.private + self.kv.pinned
        if self.next_at != math.inf and self._c > 0:
            if self._work is None:
                done = min(self._k, int((now - self._t0) / self._c))
                extra_tokens = done * len(self.running)
                if done:
                    bs = self.bs
                    used += sum(-(-(j.computed + done) // bs) - j.blocks for j in self.running)
            extra_busy = min(now - self._t0, self._k * self._c)
        queried = self._queried.total(now)
        return (
            len(self.running),
            len(self.waiting),
            min(1.0, used / self.kv.total),
            (self._generated.total(now) + extra_tokens) / window,
            self._hits.total(now) / queried if queried > 0 else 0.0,
            min(1.0, (self._busy.total(now) + extra_busy) / window),
        )

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    # --- steps ---------------------------------------------------------------------------

    def _set_next(self, t: float) -> None:
        self.next_at = t
        self.version += 1

    def _step_s(self, batch: int, prefill: int) -> float:
        if prefill == 0:
            cached = self._decode_ms.get(batch)
            if cached is None:
                cached = SimScheduler.step_cost_ms(self._cost, batch_size=batch, prefill_tokens=0)  # type: ignore[arg-type]
                self._decode_ms[batch] = cached
            return cached / 1e3
        ms = SimScheduler.step_cost_ms(self._cost, batch_size=batch, prefill_tokens=prefill)  # type: ignore[arg-type]
        return ms / 1e3

    def _plan(self, now: float) -> None:
        if not self.running and not self.waiting:
            self._work = None
            self._set_next(math.inf)
            return
        if self._leap(now):
            return
        work = self._single_plan(now)
        if not work:
            self._work = None
            self._set_next(math.inf)
            return
        prefill = sum(n for j, n in work if not (n == 1 and j.out > 0 and j.remaining == 1))
        self._work = work
        self._t0 = now
        self._k = 1
        self._c = self._step_s(len(work), prefill)
        self._set_next(now + self._c)

    def _leap(self, now: float) -> bool:
        """Plan a leap of decode steps if nothing but decoding can happen; True if planned."""
        run = self.running
        if not run or len(run) > self.config.max_num_batched_tokens:
            return False
        for j in run:
            if j.prompt + j.out - j.computed != 1 or j.out == 0:  # remaining, inlined
                return False
        if self.waiting and len(run) < self.config.max_num_seqs and self._admissible(now):
            return False
        k = min(j.target - j.out for j in run)
        limit = self.config.max_model_len
        k = min(k, min(limit - j.prompt - j.out for j in run))
        free = self.kv.free
        bs = self.bs
        if sum(-(-(j.computed + k) // bs) - j.blocks for j in run) > free:
            lo, hi = 0, k  # largest steps whose blocks fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if sum(-(-(j.computed + mid) // bs) - j.blocks for j in run) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if k < 2:
            return False
        self._work = None
        self._t0 = now
        self._k = k
        self._c = self._step_s(len(run), 0)
        self._set_next(now + k * self._c)
        return True

    def _admissible(self, now: float) -> bool:
        """Whether the head of the queue could be admitted now (no state change)."""
        head = self.waiting[0]
        budget = self.config.max_num_batched_tokens - len(self.running)
        if budget <= 0:
            return False
        hits = self.kv.lookup(head.chain, (head.tokens - 1) // self.bs)
        cached = sum(n for _, n in hits) * self.bs
        todo = head.tokens - cached
        n = min(todo, budget)
        if n < todo and not self.config.chunked_prefill:
            return False
        new = -(-(cached + n) // self.bs) - cached // self.bs
        return self.kv.idle_blocks(hits) + new <= self.kv.free

    def _end_leap(self, steps: int, now: float) -> None:
        run = self.running
        bs = self.bs
        grow = 0
        for j in run:
            j.computed += steps
            j.out += steps
            need = -(-j.computed // bs) - j.blocks
            j.blocks += need
            grow += need
        if grow:
            self.kv.allocate(grow)
        self._generated.add(now, steps * len(run))
        self._busy.add(now, steps * self._c)
        limit = self.config.max_model_len
        done = [j for j in run if j.out >= j.target or j.prompt + j.out >= limit]
        for j in done:
            self._finish(j, now)

    def _single_plan(self, now: float) -> list[tuple[Job, int]]:
        """``SimScheduler.begin_step``, on this model's state."""
        budget = self.config.max_num_batched_tokens
        work: list[tuple[Job, int]] = []
        preempted = False
        order = sorted(self.running, key=_key)
        kv = self.kv
        bs = self.bs
        while len(work) < len(order) and budget > 0:
            j = order[len(work)]
            n = min(j.remaining, budget)
            need = -(-(j.computed + n) // bs) - j.blocks
            stopped = False
            while need > kv.free:
                victim = order.pop()
                self._preempt(victim)
                preempted = True
                if victim is j:
                    stopped = True
                    break
            if stopped:
                continue
            kv.allocate(need)
            j.blocks += need
            work.append((j, n))
            budget -= n
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                n = self._admit(self.waiting[0], budget, now)
                if n == 0:
                    break
                work.append((self.waiting.pop(0), n))
                budget -= n
        return work

    def _admit(self, j: Job, budget: int, now: float) -> int:
        kv = self.kv
        bs = self.bs
        hits = kv.lookup(j.chain, (j.tokens - 1) // bs)
        cached_blocks = sum(n for _, n in hits)
        cached = cached_blocks * bs
        todo = j.tokens - cached
        n = min(todo, budget)
        if n < todo and not self.config.chunked_prefill:
            return 0
        new = -(-(cached + n) // bs) - cached_blocks
        if kv.idle_blocks(hits) + new > kv.free:
            return 0
        for e, _ in hits:
            kv.hold(e)
        j.holds = [e for e, _ in hits]
        kv.allocate(new)
        j.blocks = cached_blocks + new
        j.shared = cached_blocks
        j.computed = cached
        j.registered = False
        self.running.append(j)
        if self.config.enable_prefix_caching:
            self._queried.add(now, j.tokens)
            self._hits.add(now, cached)
        return n

    def _end_single(self, now: float) -> None:
        work, self._work = self._work or [], None
        self._busy.add(now, self._c)
        produced = 0
        limit = self.config.max_model_len
        for j, n in work:
            j.computed += n
            if not j.registered and j.computed >= j.prompt:
                self._register(j, j.computed)
            if j.computed < j.prompt + j.out:
                continue
            j.out += 1
            produced += 1
            if j.out == 1:
                self.emit("first", j, now)
            if j.out >= j.target or j.prompt + j.out >= limit:
                self._finish(j, now)
        self._generated.add(now, produced)

    def _register(self, j: Job, computed: int) -> None:
        """The prompt's shared prefixes are computed: make them findable."""
        j.registered = True
        if not self.config.enable_prefix_caching:
            return
        have = 0
        held = {id(e) for e in j.holds}
        for key, cap in j.chain:
            cap = min(cap, computed // self.bs)
            if cap <= have:
                break
            entry, moved = self.kv.register(key, cap - have, False)
            if id(entry) not in held:
                j.holds.append(entry)
                held.add(id(entry))
            else:
                self.kv.release(entry)  # register took a second hold
            j.shared += moved
            have = cap

    def _finish(self, j: Job, now: float) -> None:
        self.running.remove(j)
        kv = self.kv
        if j.extend_key is not None and self.config.enable_prefix_caching:
            chain = j.chain
            if chain and chain[-1][0] == j.extend_key:
                base = chain[-2][1] if len(chain) > 1 else 0
            else:
                base = chain[-1][1] if chain else 0
            entry, moved = kv.register(j.extend_key, j.computed // self.bs - base, False)
            j.shared += moved
            kv.release(entry)
        kv.free_private(j.blocks - j.shared)
        for e in j.holds:
            kv.release(e)
        j.holds = []
        self.emit("done", j, now)

    def _preempt(self, j: Job) -> None:
        self.running.remove(j)
        self.kv.free_private(j.blocks - j.shared)
        for e in j.holds:
            self.kv.release(e)
        j.holds = []
        j.blocks = j.shared = j.computed = 0
        j.registered = False
        bisect.insort(self.waiting, j, key=_key)
