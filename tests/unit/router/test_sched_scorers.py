"""Every memoised scorer, as tables of inline worker rows → expected (unclamped) scores and
the detail string that explains them. The framework clamps; these are the raw formulas."""

from __future__ import annotations

from typing import Any

import pytest

from services.router.scheduling.params import ParamError
from services.router.scheduling.plugin import Candidates, WorkerScorer
from services.router.scheduling.scorers.gpu import GpuScorer
from services.router.scheduling.scorers.kv_cache import KvCacheScorer
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.scorers.load import LoadScorer
from services.router.scheduling.scorers.loss import LossScorer
from services.router.scheduling.scorers.queue import QueueScorer
from services.router.scheduling.scorers.region import RegionProximityScorer
from services.router.scheduling.scorers.throughput import ThroughputScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


def w(worker_id: str = "w", **kw: Any) -> WorkerSnapshot:
    return WorkerSnapshot(worker_id=worker_id, region=kw.pop("region", "eu"), address="a:1", **kw)


QUERY = RouteQuery(request_id="r", model="m")

CASES: list[tuple[WorkerScorer[Any], WorkerSnapshot, Any, str]] = [
    # latency: tau / (tau + rtt); unknown RTT is penalised, not excluded
    (LatencyScorer(), w(rtt_ms=0.0), 1.0, "rtt=0.0ms"),
    (LatencyScorer(), w(rtt_ms=2.0), 50 / 52, "rtt=2.0ms"),
    (LatencyScorer(), w(rtt_ms=50.0), 0.5, "rtt=50.0ms"),
    (LatencyScorer(), w(rtt_ms=150.0), 0.25, "rtt=150.0ms"),
    (LatencyScorer(tau_ms=10), w(rtt_ms=30.0), 0.25, "rtt=30.0ms"),
    (LatencyScorer(), w(rtt_ms=None), 0.25, "rtt=unknown"),
    (LatencyScorer(unknown_score=0.0), w(rtt_ms=None), 0.0, "rtt=unknown"),
    # loss: 1 - loss / max_loss (negative below max: the framework clamps to 0)
    (LossScorer(), w(loss=0.0), 1.0, "loss=0.0%"),
    (LossScorer(), w(loss=0.01), 0.8, "loss=1.0%"),
    (LossScorer(), w(loss=0.10), -1.0, "loss=10.0%"),
    (LossScorer(max_loss=0.2), w(loss=0.10), 0.5, "loss=10.0%"),
    # queue: 1 - (running + waiting + in_flight) / (max_running * full_at)
    (QueueScorer(), w(running=0, max_running=20), 1.0, "slots=0+0+0/20"),
    (QueueScorer(), w(running=9, max_running=20), 0.55, "slots=9+0+0/20"),
    (QueueScorer(), w(running=9, waiting=2, in_flight=1, max_running=20), 0.4, "slots=9+2+1/20"),
    (QueueScorer(), w(running=20, waiting=10, max_running=20), -0.5, "slots=20+10+0/20"),
    (QueueScorer(full_at=1.5), w(running=20, waiting=10, max_running=20), 0.0, "slots=20+10+0/20"),
    # kv-cache: 1 - usage
    (KvCacheScorer(), w(kv_cache_usage=0.25), 0.75, "kv=0.25"),
    (KvCacheScorer(), w(kv_cache_usage=1.0), 0.0, "kv=1.00"),
    # gpu: 1 - utilisation; neutral when the host has no NVML
    (GpuScorer(), w(gpu_utilization=0.8), pytest.approx(0.2), "gpu=0.80"),
    (GpuScorer(), w(gpu_utilization=None), 0.5, "gpu=n/a"),
    (GpuScorer(unknown_score=0.3), w(gpu_utilization=None), 0.3, "gpu=n/a"),
    # throughput: per-stream decode rate against a target; idle = all headroom
    (ThroughputScorer(), w(running=0), 1.0, "idle"),
    (
        ThroughputScorer(),
        w(running=10, tokens_per_second=600.0),
        2.0,
        "tps=600/10 streams (60.0/stream)",
    ),
    (
        ThroughputScorer(),
        w(running=10, tokens_per_second=150.0),
        0.5,
        "tps=150/10 streams (15.0/stream)",
    ),
    (
        ThroughputScorer(),
        w(running=10, tokens_per_second=0.0),
        0.5,
        "tps=0/10 streams (0.0/stream)",
    ),
    (
        ThroughputScorer(target_tokens_per_s=15),
        w(running=10, tokens_per_second=150.0),
        1.0,
        "tps=150/10 streams (15.0/stream)",
    ),
    # load: 1 - max(slot pressure, kv)
    (
        LoadScorer(),
        w(running=9, max_running=20, kv_cache_usage=0.3),
        0.55,
        "load=0.45 (slots=9+0+0/20 kv=0.30)",
    ),
    (
        LoadScorer(),
        w(running=2, max_running=20, kv_cache_usage=0.7),
        pytest.approx(0.3),
        "load=0.70 (slots=2+0+0/20 kv=0.70)",
    ),
    (
        LoadScorer(include_gpu=True),
        w(running=2, max_running=20, gpu_utilization=0.9),
        pytest.approx(0.1),
        "load=0.90 (slots=2+0+0/20 kv=0.00 gpu=0.90)",
    ),
]


@pytest.mark.parametrize(("scorer", "row", "score", "detail"), CASES)
def test_scorer_formula_and_detail(
    scorer: WorkerScorer[Any], row: WorkerSnapshot, score: Any, detail: str
) -> None:
    key = scorer.key(QUERY)
    assert scorer.scores([row], key) == [score]
    assert scorer.describe(row, key) == detail
    # The plain Scorer interface answers the same, by worker id.
    assert scorer.score(QUERY, Candidates([row])) == {row.worker_id: score}
    assert scorer.detail(QUERY, row) == detail


@pytest.mark.parametrize(
    ("client_region", "scores"),
    [
        ("seoul", [1.0, 0.5, 0.0]),
        ("tokyo", [0.0, 1.0, 0.0]),
        ("", [0.0, 0.0, 0.0]),
    ],
)
def test_region_proximity_prefers_the_client_region_then_its_neighbours(
    client_region: str, scores: list[float]
) -> None:
    scorer = RegionProximityScorer(neighbors={"seoul": frozenset({"tokyo"})}, neighbor_score=0.5)
    rows = [w("a", region="seoul"), w("b", region="tokyo"), w("c", region="virginia")]
    key = scorer.key(RouteQuery(request_id="r", model="m", client_region=client_region))
    assert scorer.scores(rows, key) == scores


def test_scores_are_computed_for_a_whole_batch_in_input_order() -> None:
    rows = [w("a", rtt_ms=50.0), w("b", rtt_ms=None), w("c", rtt_ms=0.0)]
    assert LatencyScorer().scores(rows, None) == [0.5, 0.25, 1.0]


@pytest.mark.parametrize(
    ("build", "path"),
    [
        (lambda: LatencyScorer(tau_ms=0), "tau_ms"),
        (lambda: LatencyScorer(unknown_score=1.5), "unknown_score"),
        (lambda: LossScorer(max_loss=0), "max_loss"),
        (lambda: QueueScorer(full_at=-1), "full_at"),
        (lambda: GpuScorer(unknown_score=-0.1), "unknown_score"),
        (lambda: ThroughputScorer(target_tokens_per_s=0), "target_tokens_per_s"),
        (lambda: RegionProximityScorer(neighbor_score=2), "neighbor_score"),
    ],
)
def test_scorer_parameters_are_validated_at_construction(build: Any, path: str) -> None:
    with pytest.raises(ParamError) as err:
        build()
    assert err.value.path == path
