"""The pure scheduler, driven step by step on a manual clock: batching, KV pressure,
preemption, prefix caching, aborts, finish rules and load reports."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.common.clock import ManualClock
from services.common.errors import InvalidRequest, Overloaded
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingOptions,
)
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler
from services.worker.sim.sequence import SeqState
from services.worker.sim.text import render_chat, tokenize

MODEL = "meridian-sim"


def req(
    request_id: str,
    text: str = "Say something about routers.",
    *,
    priority: int = 0,
    **sampling: Any,
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model=MODEL,
        messages=(ChatTurn(role="user", content=text),),
        sampling=SamplingOptions(**sampling),
        priority=priority,
    )


def words(n: int, tag: str = "") -> str:
    """A prompt of ``n`` one-token words (plus the tag); ``tag`` first makes its leading block
    unique."""
    return f"{tag} " + " ".join(_VOCAB[i % len(_VOCAB)] for i in range(n))


_VOCAB = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


@dataclass
class Run:
    outputs: dict[str, list[EngineOutput]] = field(default_factory=lambda: defaultdict(list))
    first_token_at: dict[str, float] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    max_kv_usage: float = 0.0
    steps: int = 0

    def text(self, request_id: str) -> str:
        return "".join(o.text for o in self.outputs[request_id])

    def final(self, request_id: str) -> EngineOutput:
        return self.outputs[request_id][-1]


def run(
    s: SimScheduler, clock: ManualClock, run_: Run | None = None, *, until: str | None = None
) -> Run:
    """Step until idle (or until ``until`` has its first token), advancing the clock by each
    step's duration."""
    r = run_ if run_ is not None else Run()
    while True:
        result = s.step(clock.monotonic())
        if result is None:
            return r
        clock.advance(result.plan.duration_s)
        r.steps += 1
        r.preempted.extend(result.plan.preempted)
        r.max_kv_usage = max(r.max_kv_usage, s.kv.usage)
        for rid, out in result.outputs.items():
            r.outputs[rid].append(out)
            r.first_token_at.setdefault(rid, result.finished_at)
        if until is not None and until in r.first_token_at:
            return r


def test_step_time_grows_with_batch_size() -> None:
    config = SimConfig(decode_base_ms=6.0, decode_ms_per_seq=0.5, prefill_ms_per_token=0.0)
    durations = {}
    for batch in (1, 4, 16, 64):
        s = SimScheduler(config)
        clock = ManualClock()
        for i in range(batch):
            s.add(req(f"r{i}", ignore_eos=True, max_tokens=50), clock.monotonic())
        s.step(clock.monotonic())  # prefill step
        decode = s.step(clock.monotonic())
        assert decode is not None
        assert decode.plan.decode_seqs == batch
        durations[batch] = decode.plan.duration_s
    assert durations == pytest.approx({n: (6.0 + 0.5 * n) / 1000 for n in (1, 4, 16, 64)})


def test_prefill_cost_is_charged_per_prompt_token_and_scaled_by_time_scale() -> None:
    config = SimConfig(prefill_ms_per_token=0.1, decode_base_ms=2.0, decode_ms_per_seq=1.0)
    prompt_tokens = len(tokenize(render_chat(req("x", words(300)).messages)))
    for scale in (1.0, 0.01):
        s = SimScheduler(SimConfig.from_mapping({**_fields(config), "time_scale": scale}))
        s.add(req("a", words(300)), 0.0)
        result = s.step(0.0)
        assert result is not None
        assert result.plan.prefill_tokens == prompt_tokens
        expected_ms = 2.0 + 1.0 + 0.1 * prompt_tokens
        assert result.plan.duration_s == pytest.approx(expected_ms * scale / 1000)


def _fields(config: SimConfig) -> dict[str, object]:
    return {
        "prefill_ms_per_token": config.prefill_ms_per_token,
        "decode_base_ms": config.decode_base_ms,
        "decode_ms_per_seq": config.decode_ms_per_seq,
    }


def test_requests_queue_when_the_kv_cache_is_full() -> None:
    # 64 blocks of 16 tokens; each prompt takes ~19 blocks, so three fit and the rest wait.
    config = SimConfig(kv_cache_tokens=1024, max_model_len=1024, enable_prefix_caching=False)
    s = SimScheduler(config)
    clock = ManualClock()
    for i in range(6):
        s.add(req(f"r{i}", words(290, tag=f"t{i}"), max_tokens=8), clock.monotonic())
    first = s.step(clock.monotonic())
    assert first is not None
    assert first.plan.admitted == ("r0", "r1", "r2")
    load = s.load(clock.monotonic())
    assert (load.running, load.waiting) == (3, 3)
    assert load.kv_cache_usage > 0.85
    r = run(s, clock)
    assert r.max_kv_usage <= 1.0
    assert all(r.final(f"r{i}").finish_reason is not None for i in range(6))
    # The queued ones waited for the first ones to finish.
    assert r.final("r3").queue_ms > r.final("r0").queue_ms  # type: ignore[operator]
    assert s.kv.used_blocks == 0


def test_batch_is_capped_at_max_num_seqs() -> None:
    s = SimScheduler(SimConfig(max_num_seqs=4))
    for i in range(10):
        s.add(req(f"r{i}"), 0.0)
    s.step(0.0)
    assert (s.load(0.0).running, s.load(0.0).waiting, s.load(0.0).max_running) == (4, 6, 4)


def test_ttft_grows_with_load() -> None:
    """A probe request's time to first token, with ``k`` long requests already decoding: more
    sequences make every step slower, and past ``max_num_seqs`` the probe has to queue."""
    ttft = {}
    for k in (0, 8, 32, 63, 100):
        s = SimScheduler(SimConfig(max_num_seqs=64, kv_cache_tokens=262144))
        clock = ManualClock()
        for i in range(k):
            s.add(req(f"bg{i}", words(100, f"b{i}"), ignore_eos=True, max_tokens=2000), 0.0)
        for _ in range(5):  # the background load is past its prefill and decoding
            result = s.step(clock.monotonic())
            if result is not None:
                clock.advance(result.plan.duration_s)
        arrival = clock.monotonic()
        s.add(req("probe", words(100, "probe")), arrival)
        r = run(s, clock, until="probe")
        ttft[k] = r.first_token_at["probe"] - arrival
    values = [ttft[k] for k in (0, 8, 32, 63, 100)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert ttft[100] > 10 * ttft[63]  # queueing dwarfs a slower step


def test_decode_preempts_the_newest_request_when_kv_runs_out() -> None:
    # 32 blocks of 16 tokens; four requests need ~15 blocks each by the end.
    config = SimConfig(
        kv_cache_tokens=512, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False
    )
    s = SimScheduler(config)
    clock = ManualClock()
    for i in range(4):
        s.add(req(f"r{i}", words(30, f"t{i}"), ignore_eos=True, max_tokens=200), 0.0)
    r = run(s, clock)
    assert r.preempted, "the cache was too small for all four; someone must have been preempted"
    assert r.preempted[0] == "r3"
    assert r.max_kv_usage <= 1.0
    for i in range(4):
        final = r.final(f"r{i}")
        assert (final.finish_reason, final.completion_tokens) == (FinishReason.LENGTH, 200)
        assert sum(len(o.token_ids) for o in r.outputs[f"r{i}"]) == 200
    assert s.kv.used_blocks == 0

    # Recompute is invisible in the output: the same text as a run with room to spare.
    roomy = SimScheduler(SimConfig(enable_prefix_caching=False))
    roomy.add(req("r3", words(30, "t3"), ignore_eos=True, max_tokens=200), 0.0)
    assert run(roomy, ManualClock()).text("r3") == r.text("r3")


def test_a_preempted_request_resumes_before_later_arrivals() -> None:
    config = SimConfig(kv_cache_tokens=512, max_model_len=256, max_num_seqs=8)
    s = SimScheduler(config)
    clock = ManualClock()
    for i in range(4):
        s.add(req(f"r{i}", words(30, f"t{i}"), ignore_eos=True, max_tokens=200), 0.0)
    r = Run()
    while not r.preempted:
        result = s.step(clock.monotonic())
        assert result is not None
        clock.advance(result.plan.duration_s)
        r.preempted.extend(result.plan.preempted)
    s.add(req("late", words(30, "late"), max_tokens=4), clock.monotonic())
    victim = s.get(r.preempted[0])
    assert victim is not None
    assert victim.state is SeqState.WAITING
    admitted: list[str] = []
    while "late" not in admitted:
        result = s.step(clock.monotonic())
        assert result is not None
        clock.advance(result.plan.duration_s)
        admitted.extend(result.plan.admitted)
    assert admitted.index(r.preempted[0]) < admitted.index("late")


def test_prefix_cache_hits_on_a_repeated_prompt() -> None:
    config = SimConfig(prefill_ms_per_token=0.05, block_size=16)
    s = SimScheduler(config)
    clock = ManualClock()
    prompt = words(1000, "shared")
    n_prompt = len(tokenize(render_chat(req("x", prompt).messages)))

    s.add(req("first", prompt, max_tokens=4), clock.monotonic())
    first = s.step(clock.monotonic())
    assert first is not None
    clock.advance(first.plan.duration_s)
    run(s, clock)
    assert s.load(clock.monotonic()).prefix_cache_hit_rate == 0.0

    s.add(req("again", prompt, max_tokens=4), clock.monotonic())
    again = s.step(clock.monotonic())
    assert again is not None
    cached = (n_prompt - 1) // 16 * 16  # whole blocks, at least one token left to compute
    assert again.plan.prefill_tokens == n_prompt - cached
    assert again.plan.duration_s < first.plan.duration_s / 5
    out = again.outputs["again"]
    assert (out.prompt_tokens, out.cached_prompt_tokens) == (n_prompt, cached)
    assert s.load(clock.monotonic()).prefix_cache_hit_rate == pytest.approx(cached / (2 * n_prompt))


def test_prefix_cache_hits_need_the_same_start_and_can_be_turned_off() -> None:
    prompt = words(500, "same")
    for enabled, other_start in ((True, False), (True, True), (False, False)):
        s = SimScheduler(SimConfig(enable_prefix_caching=enabled))
        clock = ManualClock()
        s.add(req("a", prompt, max_tokens=2), 0.0)
        run(s, clock)
        second = ("x" + prompt) if other_start else prompt
        s.add(req("b", second, max_tokens=2), clock.monotonic())
        cached = run(s, clock).final("b").cached_prompt_tokens
        assert (cached > 0) == (enabled and not other_start)


def test_abort_frees_kv_at_once_and_returns_an_abort_output() -> None:
    s = SimScheduler(SimConfig())
    clock = ManualClock()
    s.add(req("a", words(200), ignore_eos=True, max_tokens=100), 0.0)
    s.add(req("b", words(200, "b"), ignore_eos=True, max_tokens=100), 0.0)
    run_ = Run()
    for _ in range(3):
        result = s.step(clock.monotonic())
        assert result is not None
        clock.advance(result.plan.duration_s)
        for rid, out in result.outputs.items():
            run_.outputs[rid].append(out)
    held = s.kv.used_blocks
    final = s.abort("a", clock.monotonic())
    assert final is not None
    assert final.finish_reason is FinishReason.ABORT
    assert final.completion_tokens == 3
    assert final.decode_ms is not None
    assert 0 < s.kv.used_blocks < held
    assert s.load(clock.monotonic()).running == 1
    assert s.abort("a", clock.monotonic()) is None  # idempotent
    assert s.abort("never-seen", clock.monotonic()) is None


def test_abort_mid_step_discards_the_aborted_share() -> None:
    s = SimScheduler(SimConfig())
    s.add(req("a"), 0.0)
    s.add(req("b"), 0.0)
    plan = s.begin_step(0.0)
    assert plan is not None
    assert s.kv.used_blocks > 0
    s.abort("a", 0.001)
    s.abort("b", 0.001)
    assert s.kv.used_blocks == 0
    assert s.end_step(plan.duration_s) == {}
    assert s.begin_step(1.0) is None


def test_abort_of_a_waiting_request_leaves_the_queue() -> None:
    s = SimScheduler(SimConfig(max_num_seqs=1))
    s.add(req("a"), 0.0)
    s.add(req("b"), 0.0)
    s.step(0.0)
    assert s.load(0.0).waiting == 1
    final = s.abort("b", 0.5)
    assert final is not None
    assert (final.finish_reason, final.completion_tokens, final.queue_ms) == (
        FinishReason.ABORT,
        0,
        500.0,
    )
    assert s.load(0.5).waiting == 0


def test_higher_priority_is_admitted_first_fifo_within_a_priority() -> None:
    s = SimScheduler(SimConfig(max_num_seqs=1))
    clock = ManualClock()
    s.add(req("running", max_tokens=3), 0.0)
    s.step(0.0)
    s.add(req("low-1", priority=1, max_tokens=1), 0.0)
    s.add(req("high", priority=3, max_tokens=1), 0.0)
    s.add(req("low-2", priority=1, max_tokens=1), 0.0)
    s.add(req("std", priority=2, max_tokens=1), 0.0)
    admitted: list[str] = []
    while (result := s.step(clock.monotonic())) is not None:
        clock.advance(result.plan.duration_s)
        admitted.extend(result.plan.admitted)
    assert admitted == ["high", "std", "low-1", "low-2"]


def test_same_seed_same_text_different_seed_different_text() -> None:
    def text(request_id: str, **sampling: Any) -> str:
        s = SimScheduler(SimConfig())
        s.add(req(request_id, max_tokens=60, **sampling), 0.0)
        return run(s, ManualClock()).text(request_id)

    assert text("a", seed=11) == text("b", seed=11)
    assert text("a", seed=11) != text("a", seed=12)
    assert text("a") != text("b")  # no seed: derived from the request id
    assert text("a", temperature=0.0) == text("b", temperature=0.0, seed=5)  # greedy


def test_natural_length_stops_within_range_unless_ignore_eos() -> None:
    config = SimConfig(output_len_min=10, output_len_max=30)
    lengths = set()
    for i in range(20):
        s = SimScheduler(config)
        s.add(req(f"r{i}"), 0.0)
        final = run(s, ManualClock()).final(f"r{i}")
        assert final.finish_reason is FinishReason.STOP
        assert 10 <= final.completion_tokens <= 30
        lengths.add(final.completion_tokens)
    assert len(lengths) > 5  # drawn per request, not fixed
    s = SimScheduler(config)
    s.add(req("long", ignore_eos=True, max_tokens=100), 0.0)
    final = run(s, ManualClock()).final("long")
    assert (final.finish_reason, final.completion_tokens) == (FinishReason.LENGTH, 100)


def test_max_tokens_ends_with_length_and_usage_is_cumulative() -> None:
    s = SimScheduler(SimConfig(output_len_min=100, output_len_max=100))
    s.add(req("a", max_tokens=7), 0.0)
    r = run(s, ManualClock())
    outs = r.outputs["a"]
    assert [o.completion_tokens for o in outs] == list(range(1, 8))
    assert [o.finish_reason for o in outs] == [None] * 6 + [FinishReason.LENGTH]
    assert all(o.prompt_tokens == outs[0].prompt_tokens > 0 for o in outs)


def finish(config: SimConfig, **sampling: Any) -> tuple[FinishReason | None, int]:
    s = SimScheduler(config)
    s.add(req("a", seed=5, **sampling), 0.0)
    final = run(s, ManualClock()).final("a")
    return final.finish_reason, final.completion_tokens


def test_min_tokens_equal_to_max_tokens_ends_on_the_limit_with_length() -> None:
    """vLLM masks end-of-sequence until min_tokens tokens are out, so with min_tokens ==
    max_tokens the end can only be the length limit — ``length``, not ``stop``, although the
    natural end (here at 8..24 tokens) passed long before."""
    config = SimConfig(output_len_min=8, output_len_max=24)
    assert finish(config, max_tokens=100, min_tokens=100) == (FinishReason.LENGTH, 100)
    assert finish(config, min_tokens=100) == (FinishReason.STOP, 101)  # no max_tokens: room


def test_a_natural_end_that_min_tokens_held_back_comes_right_after_it() -> None:
    """Masked up to token ``min_tokens``, end-of-sequence is sampled at the first step it may
    be: ``min_tokens + 1``, which is ``stop`` even when that step also reaches max_tokens
    (vLLM checks end-of-sequence before the limits)."""
    config = SimConfig(output_len_min=8, output_len_max=24)
    assert finish(config, max_tokens=100, min_tokens=60) == (FinishReason.STOP, 61)
    assert finish(config, max_tokens=100, min_tokens=99) == (FinishReason.STOP, 100)
    assert finish(config, max_tokens=100, min_tokens=4) == finish(config, max_tokens=100)


def test_a_natural_end_at_exactly_max_tokens_is_stop() -> None:
    """End-of-sequence sampled at the step that reaches max_tokens: vLLM reports ``stop``
    (it is checked first); one token earlier, the limit wins."""
    config = SimConfig(output_len_min=30, output_len_max=30)
    assert finish(config, max_tokens=30) == (FinishReason.STOP, 30)
    assert finish(config, max_tokens=29) == (FinishReason.LENGTH, 29)


def test_without_max_tokens_the_context_is_the_limit() -> None:
    config = SimConfig(max_model_len=64, kv_cache_tokens=1024)
    s = SimScheduler(config)
    s.add(req("a", ignore_eos=True), 0.0)
    final = run(s, ManualClock()).final("a")
    assert final.finish_reason is FinishReason.LENGTH
    assert final.prompt_tokens + final.completion_tokens == 64


def test_stop_string_ends_the_text_before_it() -> None:
    s = SimScheduler(SimConfig())
    s.add(req("a", seed=3, ignore_eos=True, max_tokens=80), 0.0)
    full = run(s, ManualClock()).text("a")
    stop = full[40:52]  # spans several tokens
    cut = full.index(stop)

    s = SimScheduler(SimConfig())
    s.add(req("a", seed=3, ignore_eos=True, max_tokens=80, stop=("never there", stop)), 0.0)
    r = run(s, ManualClock())
    assert r.text("a") == full[:cut]  # nothing of the stop string leaked into any delta
    assert r.final("a").finish_reason is FinishReason.STOP
    assert not any(stop in o.text for o in r.outputs["a"])


def test_a_stop_string_within_the_first_min_tokens_does_not_stop() -> None:
    """vLLM checks stop strings only past ``min_tokens`` (its detokenizer), as it masks
    end-of-sequence there."""
    s = SimScheduler(SimConfig())
    s.add(req("a", seed=3, ignore_eos=True, max_tokens=80), 0.0)
    full = run(s, ManualClock()).text("a")
    stop = full[40:52]
    assert full.count(stop) == 1

    def ended(min_tokens: int) -> tuple[str, FinishReason | None, int]:
        s = SimScheduler(SimConfig())
        s.add(
            req("a", seed=3, ignore_eos=True, max_tokens=80, stop=(stop,), min_tokens=min_tokens),
            0.0,
        )
        r = run(s, ManualClock())
        return r.text("a"), r.final("a").finish_reason, r.final("a").completion_tokens

    assert ended(79) == (full, FinishReason.LENGTH, 80)
    text, reason, _ = ended(2)
    assert (text, reason) == (full[: full.index(stop)], FinishReason.STOP)


def test_timings_queue_and_prefill_first_decode_last() -> None:
    s = SimScheduler(SimConfig(max_num_seqs=1))
    clock = ManualClock()
    s.add(req("a", max_tokens=5), clock.monotonic())
    s.add(req("b", max_tokens=5), clock.monotonic())
    r = run(s, clock)
    first, *middle, last = r.outputs["b"]
    assert first.queue_ms is not None
    assert first.queue_ms > 0  # waited for "a"
    assert first.prefill_ms is not None
    assert first.prefill_ms > 0
    assert first.decode_ms is None
    assert all(o.queue_ms is None and o.decode_ms is None for o in middle)
    assert (last.queue_ms, last.prefill_ms) == (first.queue_ms, first.prefill_ms)
    assert last.decode_ms is not None
    assert last.decode_ms > 0


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    config = SimConfig(max_num_batched_tokens=512, chunked_prefill=True, max_model_len=4096)
    s = SimScheduler(config)
    clock = ManualClock()
    s.add(req("long", words(1800), max_tokens=2), 0.0)
    r = run(s, clock, until="long")
    assert r.steps == 4  # ~1.8k prompt tokens in 512-token chunks; the token after the last
    assert r.outputs["long"][0].completion_tokens == 1


def test_tokens_per_second_and_gpu_use_are_over_the_recent_window() -> None:
    s = SimScheduler(SimConfig(stats_window_s=1.0, decode_base_ms=10.0, decode_ms_per_seq=0.0))
    clock = ManualClock()
    for i in range(4):
        s.add(req(f"r{i}", ignore_eos=True, max_tokens=1000), clock.monotonic())
    for _ in range(150):  # 1.5 s of 10 ms steps
        result = s.step(clock.monotonic())
        assert result is not None
        clock.advance(result.plan.duration_s)
    # The last second holds ~100 steps of 4 tokens, and the GPU was busy all of it.
    busy = s.load(clock.monotonic())
    assert busy.tokens_per_second == pytest.approx(400, rel=0.05)
    assert busy.gpus[0].utilization == pytest.approx(1.0, rel=0.05)
    clock.advance(1.5)
    idle = s.load(clock.monotonic())
    assert (idle.tokens_per_second, idle.gpus[0].utilization) == (0.0, 0.0)
    assert idle.gpus[0].memory_used_fraction == 0.9


def test_a_full_admission_queue_refuses_with_overloaded() -> None:
    s = SimScheduler(SimConfig(max_waiting=2))
    s.add(req("a"), 0.0)
    s.add(req("b"), 0.0)
    with pytest.raises(Overloaded) as info:
        s.add(req("c"), 0.0)
    assert info.value.retry_after_s is not None
    s.step(0.0)  # both admitted: room again
    s.add(req("c"), 0.0)


def test_a_request_id_in_flight_cannot_be_reused() -> None:
    s = SimScheduler(SimConfig())
    s.add(req("a", max_tokens=1), 0.0)
    with pytest.raises(InvalidRequest) as info:
        s.add(req("a"), 0.0)
    assert info.value.param == "request_id"
    run(s, ManualClock())
    s.add(req("a"), 1.0)  # finished: the id is free again


def test_steps_must_alternate() -> None:
    s = SimScheduler(SimConfig())
    s.add(req("a"), 0.0)
    assert s.begin_step(0.0) is not None
    with pytest.raises(RuntimeError):
        s.begin_step(0.0)
    s.end_step(0.01)
    with pytest.raises(RuntimeError):
        s.end_step(0.02)


def test_logprobs_ride_with_each_token_when_asked() -> None:
    s = SimScheduler(SimConfig())
    s.add(req("a", max_tokens=5, logprobs=True, top_logprobs=3), 0.0)
    s.add(req("b", max_tokens=5), 0.0)
    r = run(s, ManualClock())
    assert all(len(o.logprobs) == 1 and len(o.logprobs[0].top) == 3 for o in r.outputs["a"])
    assert all(o.logprobs == () for o in r.outputs["b"])
