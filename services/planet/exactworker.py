"""The exact worker: ``SimScheduler`` itself, stepped in virtual time.

What ``SimEngine`` does in real time (``begin_step``, wait the step's duration, ``end_step``)
done on the simulator's clock instead: every step, every token, the real block-level prefix
cache. Slow (one Python step per engine step), so for small scenarios — the fidelity check
runs on it — and as the reference the fast model is tested against. Prompts are real text
(``Job.owner.messages``), so prefix caching works on real token ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from services.planet.fastworker import Job
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler

Emit = Callable[[str, Job, float], None]


class ExactWorker:
    def __init__(self, config: SimConfig, emit: Emit) -> None:
        self.config = config
        self.emit = emit
        self.next_at = math.inf
        self.version = 0
        self._sched = SimScheduler(config)
        self._jobs: dict[str, Job] = {}
        self._in_step = False
        self._waking = False

    def submit(self, job: Job, now: float) -> None:
        messages = getattr(job.owner, "messages", ()) or _synthetic(job)
        request = EngineRequest(
            request_id=str(job.rid),
            model=self.config.models[0],
            messages=tuple(ChatTurn(role, text) for role, text in messages),
            sampling=SamplingOptions(max_tokens=job.target, ignore_eos=True, seed=job.rid),
            priority=job.priority,
        )
        self._sched.add(request, now)
        self._jobs[request.request_id] = job
        if not self._in_step and not self._waking:
            self._begin(now)

    def crash(self) -> list[Job]:
        lost = list(self._jobs.values())
        self._jobs.clear()
        self._sched = SimScheduler(self.config)
        self._in_step = False
        self._set_next(math.inf)
        return lost

    def wake(self, now: float) -> None:
        outputs = self._sched.end_step(now)
        self._in_step = False
        self._waking = True  # jobs submitted by the callbacks join the next step
        for rid, out in outputs.items():
            job = self._jobs.get(rid)
            if job is None:
                continue
            job.out = out.completion_tokens
            if not job.registered:  # this job's first output: its first token
                job.registered = True
                self.emit("first", job, now)
            if out.finish_reason is not None:
                del self._jobs[rid]
                self.emit("done", job, now)
        self._waking = False
        self._begin(now)

    def _begin(self, now: float) -> None:
        plan = self._sched.begin_step(now)
        if plan is None:
            self._set_next(math.inf)
            return
        self._in_step = True
        self._set_next(now + plan.duration_s)

    def _set_next(self, t: float) -> None:
        self.next_at = t
        self.version += 1

    def load(self, now: float) -> tuple[int, int, float, float, float, float]:
        load = self._sched.load(now)
        gpu = load.gpus[0].utilization if load.gpus else 0.0
        return (
            load.running,
            load.waiting,
            load.kv_cache_usage,
            load.tokens_per_second,
            load.prefix_cache_hit_rate,
            gpu,
        )

    @property
    def busy(self) -> bool:
        return bool(self._jobs)


_WORDS = (
    "alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike",
    "oscar", "papa", "romeo", "sierra", "tango", "victor", "whisky", "yankee", "zulu",
)  # fmt: skip


def _words(seed: object, n: int) -> str:
    import random

    rng = random.Random(str(seed))
    return " ".join(rng.choice(_WORDS) for _ in range(max(0, n)))


def _synthetic(job: Job) -> tuple[tuple[str, str], ...]:
    """Text with about ``job.prompt`` tokens (one per word) whose leading words are the same for
    requests that share a prefix in ``job.chain``, so the real prefix cache finds them."""
    parts: list[str] = []
    have = 0
    for key, blocks in job.chain:
        n = blocks * 16 - have
        if n > 0:
            parts.append(_words(key, n))
            have += n
    parts.append(_words(("own", job.rid), job.prompt - have - 8))
    return (("user", " ".join(p for p in parts if p)),)
