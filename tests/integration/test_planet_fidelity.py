"""The simulator against the real stack, at a small size: ``bench.routing_quality``'s hotspot
(3 regions behind real delay proxies, real gRPC workers on ``SimEngine``, the real router with
the default profile) and the same arrivals in ``services.planet`` (exact engine). They agree
within 15 % on TTFT p50 and p99 and within 5 points on the region split.

The real stack's own processing (edge-side work, gRPC, the proxies) is measured in the same
run — a calibration pass of a few requests, one at a time, on the idle stack — and given to
the simulator as ``router.service_ms``, so what is compared is what the model claims to
predict: routing, network and engine queueing. Requests the machine held up (the one event
loop every component shares here ran late while they waited) are left out of both sides;
when more than a third were, the run measured the machine and is void, naming the lag and
the CPU wait. A run that disagrees gets another measurement (a fresh stack, the same
arrivals), up to three in all, and the test fails only when two runs that were not void
disagree: a shared CI machine can slow a whole run evenly, which the lag check cannot see,
while a wrong model disagrees every time (+15 ms of modelled overhead: p50 +25 %; a wrong
profile: a 30-point split). The full-size comparison, every profile:
``python -m bench.planet_fidelity``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import planet_fidelity as pf
from bench import routing_quality as rq

pytestmark = pytest.mark.slow


#: Measurements at most; the test fails only when two that the machine did not void disagree.
MEASUREMENTS = 3
DISAGREEMENTS_TO_FAIL = 2


def _disagreement(c: dict[str, float]) -> str | None:
    if abs(c["p50_error"]) > 0.15:
        return f"p50 off by {c['p50_error']:+.0%}"
    if abs(c["p99_error"]) > 0.15:
        return f"p99 off by {c['p99_error']:+.0%}"
    if c["split_points"] > 5.0:
        return f"region split off by {c['split_points']:.1f} points"
    return None


def test_simulated_hotspot_agrees_with_the_real_stack(tmp_path: Path) -> None:
    seen: list[str] = []
    disagreements = 0
    for n in range(MEASUREMENTS):
        work = tmp_path / f"run{n}"
        work.mkdir()
        ck = pf.check(rq.plan(20.0, 8.0, 7), 8.0, "default", 7, work)
        if ck.void:
            seen.append(f"void: {ck.void}")
            continue
        why = _disagreement(ck.comparison)
        if why is None:
            return
        disagreements += 1
        seen.append(f"{why} (service_ms {ck.service_ms}, {ck.comparison})")
        if disagreements == DISAGREEMENTS_TO_FAIL:
            pytest.fail("the simulator disagrees with the real stack: " + "; ".join(seen))
    # Fewer than two measurements the machine let stand, none agreeing: this run measured
    # the machine (a wrong model disagrees on every quiet run, and fails there).
    pytest.skip("; ".join(seen))
