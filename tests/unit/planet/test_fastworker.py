"""The fast worker model runs exactly SimScheduler's steps: same first-token and finish times."""

from __future__ import annotations

import math
import random

import pytest

from services.planet.fastworker import FastWorker, Job
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions
from services.worker.sim import SimConfig, SimScheduler
from services.worker.sim.text import render_chat, tokenize


def arrivals(seed: int, n: int, rate: float, max_words: int) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        text = " ".join(f"w{(i * 7 + k) % 1000}" for k in range(rng.randint(20, max_words)))
        out.append(
            (
                t,
                EngineRequest(
                    request_id=f"r{i}",
                    model="meridian-sim",
                    messages=(ChatTurn("user", text),),
                    sampling=SamplingOptions(max_tokens=rng.randint(1, 300), ignore_eos=True),
                    priority=rng.choice((0, 0, 1)),
                ),
            )
        )
    return out


def exact(
    cfg: SimConfig, reqs: list[tuple[float, EngineRequest]]
) -> dict[str, tuple[float, float]]:
    sch = SimScheduler(cfg)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    i, plan, end = 0, None, math.inf
    while i < len(reqs) or plan is not None:
        nxt = reqs[i][0] if i < len(reqs) else math.inf
        if plan is not None and end <= nxt:
            for rid, o in sch.end_step(end).items():
                first.setdefault(rid, end)
                if o.finish_reason is not None:
                    done[rid] = end
            now = end
            plan = sch.begin_step(now)
            end = now + plan.duration_s if plan else math.inf
        else:
            sch.add(reqs[i][1], nxt)
            i += 1
            if plan is None:
                plan = sch.begin_step(nxt)
                end = nxt + plan.duration_s if plan else math.inf
    return {rid: (first[rid], done[rid]) for rid in first}


def fast(cfg: SimConfig, reqs: list[tuple[float, EngineRequest]]) -> dict[str, tuple[float, float]]:
    first: dict[str, float] = {}
    done: dict[str, float] = {}

    def emit(kind: str, job: Job, t: float) -> None:
        (first if kind == "first" else done)[f"r{job.rid}"] = t

    w = FastWorker(cfg, emit)
    i = 0
    while i < len(reqs) or w.next_at < math.inf:
        nxt = reqs[i][0] if i < len(reqs) else math.inf
        if w.next_at <= nxt:
            w.wake(w.next_at)
        else:
            r = reqs[i][1]
            n = len(tokenize(render_chat(r.messages)))
            assert r.sampling.max_tokens is not None
            w.submit(Job(rid=i, priority=r.priority, prompt=n, target=r.sampling.max_tokens), nxt)
            i += 1
    return {rid: (first[rid], done[rid]) for rid in first}


@pytest.mark.parametrize(
    ("rate", "kv_tokens", "batch_tokens"),
    [(4.0, 8192, 2048), (20.0, 8192, 2048), (30.0, 4096, 512)],  # light, saturated, preempting
)
def test_every_first_token_and_finish_matches_sim_scheduler(
    rate: float, kv_tokens: int, batch_tokens: int
) -> None:
    cfg = SimConfig(
        max_num_seqs=8,
        kv_cache_tokens=kv_tokens,
        max_model_len=2048,
        max_num_batched_tokens=batch_tokens,
        enable_prefix_caching=False,
    )
    reqs = arrivals(seed=int(rate), n=250, rate=rate, max_words=500)
    want = exact(cfg, reqs)
    got = fast(cfg, reqs)
    assert set(got) == set(want)
    for rid, (f, d) in want.items():
        assert got[rid][0] == pytest.approx(f, abs=1e-9), rid
        assert got[rid][1] == pytest.approx(d, abs=1e-9), rid


def test_a_shared_prefix_is_found_and_saves_its_prefill() -> None:
    cfg = SimConfig(max_num_seqs=8, kv_cache_tokens=32768, max_model_len=8192)
    firsts: list[float] = []
    w = FastWorker(cfg, lambda kind, job, t: firsts.append(t) if kind == "first" else None)
    chain = (("app", 56),)  # 896 shared tokens
    for k, start in enumerate((0.0, 1.0)):
        w.submit(Job(rid=k, priority=0, prompt=920, target=4, chain=chain), start)
        while w.next_at < math.inf:
            w.wake(w.next_at)
    cold, warm = firsts[0] - 0.0, firsts[1] - 1.0
    assert cold > warm * 2  # 920 tokens of prefill, then only the 24 not cached
    assert w.load(2.0)[4] > 0  # and the hit rate says so
