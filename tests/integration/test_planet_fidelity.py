"""The simulator against the real stack, at a small size: ``bench.routing_quality``'s hotspot
(3 regions behind real delay proxies, real gRPC workers on ``SimEngine``, the real router with
the default profile) and the same arrivals in ``services.planet`` (exact engine). They agree
within 15 % on TTFT p50 and p99 and within 5 points on the region split.

The full-size comparison, every profile, is ``python -m bench.planet_fidelity``. When the real
stack's event loop stalled (this machine starved the process; its TTFTs then measure the
machine, which the simulator does not model), the comparison is skipped with the lag named:
the measurement is void, not the simulator wrong.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import uvloop

from bench import planet_fidelity as pf
from bench import routing_quality as rq

pytestmark = pytest.mark.slow

MAX_STALL_MS = 100.0
MAX_LAG_P99_MS = 25.0


def test_simulated_hotspot_agrees_with_the_real_stack(tmp_path: Path) -> None:
    asks = rq.plan(20.0, 8.0, 7)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in pf.trace(asks, with_text=True)) + "\n")
    sim = pf.simulate(trace, 8.0, "default")
    result: rq.Result = uvloop.run(rq.run_profile("default", asks, 7))
    if result.loop_stall_ms > MAX_STALL_MS or result.loop_lag_ms > MAX_LAG_P99_MS:
        pytest.skip(
            f"the real stack's event loop ran late (p99 {result.loop_lag_ms:.0f} ms, "
            f"worst {result.loop_stall_ms:.0f} ms): its TTFTs measure this machine"
        )
    live = (
        result.ttfts_ms(),
        Counter(o.region for o in result.outcomes if o.region),
        len(result.outcomes),
    )
    c = pf.compare(sim, live)
    assert abs(c["p50_error"]) <= 0.15, c
    assert abs(c["p99_error"]) <= 0.15, c
    assert c["split_points"] <= 5.0, c
