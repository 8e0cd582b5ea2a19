"""A run's results for machines (JSON) and for people (Markdown with matplotlib plots).

``summarise`` turns a finished :class:`~services.planet.sim.Planet` into a plain dict (the JSON);
``write_markdown`` renders one or several such dicts (a comparison of profiles) into
``report.md`` with PNG plots beside it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from services.planet.memory import estimate
from services.planet.metrics import Histogram, Metrics
from services.planet.sim import Planet, RunStats


def _pcts(h: Histogram | None) -> dict[str, float]:
    if h is None or h.count == 0:
        return {"count": 0, "p50": math.nan, "p90": math.nan, "p99": math.nan, "mean": math.nan}
    return {
        "count": h.count,
        "p50": round(h.percentile(0.5), 2),
        "p90": round(h.percentile(0.9), 2),
        "p99": round(h.percentile(0.99), 2),
        "mean": round(h.mean(), 2),
    }


def summarise(planet: Planet, stats: RunStats, profile_name: str) -> dict[str, Any]:
    sc = planet.sc
    m: Metrics = planet.metrics
    cut = planet.interrupted_at is not None  # goodput over what ended (see Metrics.goodput)
    est, breakdown = estimate(sc, [planet.profile])
    groups: dict[str, dict[str, Any]] = {"region": {}, "site": {}, "tier": {}}
    for (kind, name), h in m.ttft.items():
        if kind in groups:
            groups[kind].setdefault(name, {})["ttft_ms"] = _pcts(h)
    for (kind, name), h in m.itl.items():
        if kind in groups:
            groups[kind].setdefault(name, {})["itl_ms"] = _pcts(h)
    for (kind, name), h in m.e2e.items():
        if kind in groups:
            groups[kind].setdefault(name, {})["e2e_ms"] = _pcts(h)
    tiers = sorted(m.arrivals)
    for t in tiers:
        g = groups["tier"].setdefault(t, {})
        g["arrivals"] = m.arrivals[t]
        g["goodput"] = round(m.goodput([t], resolved_only=cut), 4)
        g["refused"] = sum(n for (tier, _), n in m.refused.items() if tier == t)
    util_sum: Counter[str] = Counter()
    util_n: Counter[str] = Counter()
    for row in m.series:
        for r, u in row["utilisation"].items():
            util_sum[r] += u
            util_n[r] += 1
    for r in util_n:
        groups["region"].setdefault(r, {})["utilisation"] = round(util_sum[r] / util_n[r], 4)
    split: Counter[str] = Counter()
    for (_, region), n in m.served.items():
        split[region] += n
    served_total = sum(split.values()) or 1
    for r, n in split.items():
        groups["region"].setdefault(r, {})["served"] = n
        groups["region"][r]["share"] = round(n / served_total, 4)
    arrivals = sum(m.arrivals.values())
    return {
        "scenario": sc.name,
        "source": sc.source,
        "profile": profile_name,
        "engine": sc.engine,
        "duration_s": sc.duration_s,
        "fleet": {
            "regions": len(sc.fleet_regions),
            "workers": len(sc.workers),
            "sites": len(sc.sites),
        },
        "slo": {"ttft_ms": sc.slo_ttft_ms, "itl_ms": sc.slo_itl_ms},
        "requests": arrivals,
        "goodput": round(m.goodput(resolved_only=cut), 4),
        "ttft_ms": _pcts(m.ttft.get(("all", ""))),
        "itl_ms": _pcts(m.itl.get(("all", ""))),
        "e2e_ms": _pcts(m.e2e.get(("all", ""))),
        "refused": {f"{t}/{r}": n for (t, r), n in sorted(m.refused.items())},
        "refused_total": sum(m.refused.values()),
        "residency_violations": m.residency_violations,
        "resumed": m.counts.get("resumed", 0),
        "oscillation": round(m.oscillation(), 4),
        "by_region": groups["region"],
        "by_site": groups["site"],
        "by_tier": groups["tier"],
        "series": m.series,
        "decisions_sampled": [
            {
                "t_s": round(s.t, 3),
                "site": s.site,
                "tier": s.tier,
                "explanation": s.explanation,
                "ranked": s.ranked,
            }
            for s in sorted(m.samples, key=lambda s: s.t)
        ],
        "run": {
            "wall_s": round(stats.wall_s, 2),
            "simulated_requests_per_wall_s": round(stats.requests / stats.wall_s, 1)
            if stats.wall_s
            else None,
            "cpu_s": round(stats.cpu_s, 2),
            "simulated_requests_per_cpu_s": round(stats.requests / stats.cpu_s, 1)
            if stats.cpu_s
            else None,
            "decisions": stats.decisions,
            "events": stats.events,
            "peak_rss_mib": round(stats.peak_rss_mib, 1),
            "memory_estimate_mib": round(est, 1),
            "memory_breakdown": breakdown,
            # Ctrl-C: the simulated time it stopped at (what ran is summarised), else None
            "interrupted_at_s": planet.interrupted_at,
        },
    }


def write_json(results: list[dict[str, Any]], path: Path) -> None:
    """Standard JSON: a percentile of nothing (an interval, a tier or a whole run without
    requests) is NaN in memory and ``null`` in the file (``NaN`` is not JSON: ``jq``,
    JavaScript and Go refuse it). :func:`read_result` turns it back."""
    doc = _finite_or_null(results if len(results) > 1 else results[0])
    path.write_text(json.dumps(doc, indent=1, default=str, allow_nan=False))


def read_result(result: dict[str, Any]) -> dict[str, Any]:
    """One result as :func:`write_json` wrote it, with its ``null`` numbers NaN again (the
    SLO's ``itl_ms`` is the one ``null`` that means "none")."""
    restored: dict[str, Any] = _null_to_nan({k: v for k, v in result.items() if k != "slo"})
    if "slo" in result:
        restored["slo"] = result["slo"]
    return {k: restored[k] for k in result}


def _finite_or_null(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite_or_null(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite_or_null(x) for x in v]
    return v


def _null_to_nan(v: Any) -> Any:
    if v is None:
        return math.nan
    if isinstance(v, dict):
        return {k: _null_to_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_null_to_nan(x) for x in v]
    return v


def _fmt(v: float) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.0f}"


def write_markdown(results: list[dict[str, Any]], out: Path) -> Path:
    """``report.md`` (and its plots) in ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(results, out)
    first = results[0]
    lines = [
        f"# Planet simulation: {first['scenario']}",
        "",
        f"Scenario `{first['source']}`: {first['fleet']['regions']} regions, "
        f"{first['fleet']['workers']:,} workers, {first['fleet']['sites']} edge sites (one router "
        f"replica each), {first['duration_s']:g} s simulated, engine `{first['engine']}`. "
        f"Goodput = requests whose first token came within {first['slo']['ttft_ms']:g} ms"
        + (f" and ITL ≤ {first['slo']['itl_ms']:g} ms" if first["slo"]["itl_ms"] else "")
        + ", over all requests (refused ones count as misses).",
        "",
        "| profile | requests | TTFT p50 | TTFT p99 | ITL p50 | e2e p99 | goodput | refused | "
        "residency violations | oscillation | sim req / wall s | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['profile']} | {r['requests']:,} | {_fmt(r['ttft_ms']['p50'])} ms | "
            f"{_fmt(r['ttft_ms']['p99'])} ms | {r['itl_ms']['p50']:.1f} ms | "
            f"{_fmt(r['e2e_ms']['p99'])} ms | {100 * r['goodput']:.1f} % | "
            f"{r['refused_total']:,} | "
            f"{r['residency_violations']} | {r['oscillation']:.3f} | "
            f"{r['run']['simulated_requests_per_wall_s']:,} | {r['run']['peak_rss_mib']:,.0f} MiB |"
        )
    if len(results) > 1:
        ours, baselines = results[0], results[1:]
        best99 = min(baselines, key=lambda r: r["ttft_ms"]["p99"])
        bestg = max(baselines, key=lambda r: r["goodput"])
        lines += [
            "",
            f"**{ours['profile']}** vs the best baseline: TTFT p99 "
            f"{ours['ttft_ms']['p99'] / best99['ttft_ms']['p99']:.2f}× {best99['profile']}'s "
            f"(goal ≤ 0.5×), goodput {ours['goodput'] / max(bestg['goodput'], 1e-9):.2f}× "
            f"{bestg['profile']}'s (goal ≥ 1.3×).",
        ]
    for name in plots:
        lines += ["", f"![{name}]({name})"]
    for r in results:
        lines += ["", f"## {r['profile']}", ""]
        lines += [
            "| tier | requests | goodput | refused | TTFT p50 | TTFT p99 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for t, g in sorted(r["by_tier"].items()):
            tt = g.get("ttft_ms", {})
            lines.append(
                f"| {t} | {g.get('arrivals', 0):,} | {100 * g.get('goodput', 0):.1f} % | "
                f"{g.get('refused', 0):,} | {_fmt(tt.get('p50'))} ms | {_fmt(tt.get('p99'))} ms |"
            )
        regions = sorted(r["by_region"].items(), key=lambda kv: -kv[1].get("served", 0))[:15]
        lines += ["", "Busiest regions (by requests served):", "",
                  "| region | share | utilisation | TTFT p50 | TTFT p99 | ITL p50 |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, g in regions:
            tt = g.get("ttft_ms", {})
            lines.append(
                f"| {name} | {100 * g.get('share', 0):.1f} % | "
                f"{100 * g.get('utilisation', 0):.0f} % | "
                f"{_fmt(tt.get('p50'))} ms | {_fmt(tt.get('p99'))} ms | "
                f"{g.get('itl_ms', {}).get('p50', math.nan):.1f} ms |"
            )
        sites = sorted(r["by_site"].items())
        lines += ["", "| edge site | TTFT p50 | TTFT p99 | e2e p50 |", "|---|---:|---:|---:|"]
        for name, g in sites:
            tt = g.get("ttft_ms", {})
            lines.append(
                f"| {name} | {_fmt(tt.get('p50'))} ms | {_fmt(tt.get('p99'))} ms | "
                f"{_fmt(g.get('e2e_ms', {}).get('p50'))} ms |"
            )
        if r["refused"]:
            lines += [
                "",
                "Refused (tier/reason): "
                + ", ".join(f"{k} {v:,}" for k, v in r["refused"].items()),
            ]
        run = r["run"]
        if run.get("interrupted_at_s") is not None:
            lines += [
                "",
                f"**Interrupted** (Ctrl-C) at {run['interrupted_at_s']:,.1f} s of "
                f"{r['duration_s']:g} s simulated: these figures cover what ran (goodput over "
                "the requests that finished or were refused by then).",
            ]
        lines += [
            "",
            f"Run: {run['wall_s']:,} s wall ({run.get('cpu_s', '?')} s CPU), "
            f"{run['decisions']:,} decisions, {run['events']:,} events; "
            f"memory estimate {run['memory_estimate_mib']:,} MiB "
            f"({run['memory_breakdown']}), peak RSS {run['peak_rss_mib']:,} MiB.",
        ]
        if r["decisions_sampled"]:
            lines += ["", "Sample of decisions (reservoir over the run):", ""]
            for d in r["decisions_sampled"][:20]:
                lines.append(f"- t={d['t_s']:.1f}s {d['site']} ({d['tier']}): {d['explanation']}")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _plots(results: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for r in results:
        s = r["series"]
        t = [row["t_s"] / 60 for row in s]
        axes[0].plot(t, [row["ttft_p99_ms"] for row in s], label=f"{r['profile']} p99")
        axes[0].plot(
            t, [row["ttft_p50_ms"] for row in s], linestyle=":", label=f"{r['profile']} p50"
        )
        axes[1].plot(
            t, [100 * row["good"] / max(1, row["requests"]) for row in s], label=r["profile"]
        )
    axes[0].set_ylabel("TTFT (ms)")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_ylabel("goodput per interval (%)")
    axes[1].set_xlabel("simulated minutes")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "ttft_goodput.png", dpi=110)
    plt.close(fig)
    names.append("ttft_goodput.png")

    r = results[0]
    totals: Counter[str] = Counter()
    for row in r["series"]:
        totals.update(row["regions"])
    top = [name for name, _ in totals.most_common(8)]
    if top:
        fig, ax = plt.subplots(figsize=(10, 4))
        t = [row["t_s"] / 60 for row in r["series"]]
        stacks = [[row["regions"].get(name, 0) for row in r["series"]] for name in top]
        other = [
            sum(row["regions"].values()) - sum(s[i] for s in stacks)
            for i, row in enumerate(r["series"])
        ]
        ax.stackplot(t, *stacks, other, labels=[*top, "other"])
        ax.set_ylabel("requests routed per interval")
        ax.set_xlabel("simulated minutes")
        ax.set_title(f"where {r['profile']} sent traffic")
        ax.legend(fontsize=7, loc="upper left", ncol=3)
        fig.tight_layout()
        fig.savefig(out / "regions.png", dpi=110)
        plt.close(fig)
        names.append("regions.png")
    return names
