"""``python -m bench.planet``: run a scenario (once per router profile) and write the report.

    python -m bench.planet --scenario deploy/sim/planet.yaml \\
        [--profiles default round-robin nearest-region least-loaded power-of-two] \\
        [--duration 600] [--engine fast|exact] [--out bench/results/planet] [--no-progress]
        [--jobs 5|auto]                       # profiles side by side, a process each
    python -m bench.planet --calibration      # the RTT model's fit to published measurements

Bad flags exit 2 naming the flag; a bad scenario exits 2 with every problem located; a scenario
that would not fit in memory is refused before it starts, with the estimate.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from services.common import cli
from services.common.cli import UnreadableFile, read_text
from services.planet.errors import ScenarioError, ScenarioTooLarge
from services.planet.memory import estimate, limit_mib
from services.planet.parallel import ProfileProcessDied
from services.planet.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "deploy/router/profiles"


def profile_path(name: str) -> Path:
    """A shipped profile's name (``least-loaded``) or a path to one (a ``.yaml`` file, or any
    name with a folder in it: ``./mine``, ``/etc/x``), taken as given."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.parent != Path("."):
        return p
    return PROFILES / f"{name}.yaml"


def prepare_out(out: Path, p: argparse.ArgumentParser) -> None:
    """Create the report folder and prove it writable now: a folder that cannot be made
    (``/proc/x``, a read-only mount) is a usage error before the run, not a traceback after
    an hour of it."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        p.error(f"argument --out: cannot write to {str(out)!r}: {err.strerror or err}")


def check_memory(sc: Scenario, profiles: Sequence[Path] = ()) -> float:
    need, breakdown = estimate(sc, profiles)
    limit = limit_mib(sc)
    if need > limit:
        raise ScenarioTooLarge(sc.source, need, limit, breakdown)
    return need


def twice(names: Sequence[str], paths: Sequence[Path]) -> str | None:
    """Why the profiles cannot be told apart in the report, or None. A run and its report
    name a profile by its file's stem, so the same one given twice (``default`` and
    ``deploy/router/profiles/default.yaml``) would compare it with itself, and two files of
    one name would be two columns no reader could tell apart."""
    seen: dict[str, tuple[str, Path]] = {}
    for name, path in zip(names, paths, strict=True):
        if path.stem in seen:
            first, first_path = seen[path.stem]
            if first == name:
                return f"{name!r} is given twice"
            if first_path.resolve() == path.resolve():
                return f"{first!r} and {name!r} are the same profile: give it once"
            return (
                f"two profiles named {path.stem!r} ({first_path}, {path}): the report names "
                "each by its file name; rename one"
            )
        seen[path.stem] = (name, path)
    return None


def check_profiles(paths: Sequence[Path]) -> str | None:
    """Why one of the router profiles cannot be loaded (unreadable, not UTF-8, invalid), or
    None: checked before the first run starts, not found out after an hour of another's."""
    from services.router.scheduling.profile import ProfileError, load_profile

    for path in paths:
        try:
            load_profile(path)
        except ProfileError as err:
            return str(err)
    return None


def run_one(
    sc: Scenario, profile: Path, label: str, progress: Callable[[float], None] | None
) -> dict[str, Any]:
    """One profile's run, summarised; ``progress`` is called with the simulated time."""
    from services.planet.report import summarise
    from services.planet.sim import Planet

    planet = Planet(sc, profile=profile, progress=progress)
    stats = planet.run()
    return summarise(planet, stats, label)


def run_with_bar(sc: Scenario, profile: Path, label: str, bar: bool) -> dict[str, Any]:
    if not bar:
        return run_one(sc, profile, label, None)
    from tqdm import tqdm

    with tqdm(
        total=round(sc.duration_s), unit="sim s", desc=label, leave=True, file=sys.stderr
    ) as shown:

        def update(t: float) -> None:
            n = int(t)
            if n > shown.n:
                shown.update(n - shown.n)

        return run_one(sc, profile, label, update)


def _jobs(value: str) -> int:
    """``--jobs``: a count 1..256, or ``auto``: the cores this process may use (affinity and
    cgroup quota, as the edge's ``--workers auto``)."""
    if value == "auto":
        from services.common.cpus import usable_cpus

        return usable_cpus()
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a count 1..256, got {value!r}")
    return int(value)


def _choose_jobs(asked: int, chosen: Sequence[Path], sc: Scenario, need_mib: float) -> int:
    """How many profiles run side by side: as asked, no more than there are, and no more
    than fit in memory together (said when fewer); a hint when they could run side by side."""
    jobs = min(asked, len(chosen))
    if jobs > 1:
        fit = max(1, int(limit_mib(sc) // max(need_mib, 1.0)))
        if fit < jobs:
            print(
                f"--jobs {jobs}: {jobs} x {need_mib:,.0f} MiB would not fit in memory "
                f"(limit {limit_mib(sc):,.0f} MiB); "
                + (f"running {fit} side by side" if fit > 1 else "running one after another"),
                file=sys.stderr,
            )
            jobs = fit
    elif len(chosen) > 1 and (os.cpu_count() or 1) > 1:
        print(
            f"({len(chosen)} profiles one after another; --jobs {len(chosen)} runs them side by "
            "side, a core each)",
            file=sys.stderr,
        )
    return jobs


def _run_profiles(
    sc: Scenario, chosen: Sequence[Path], jobs: int, bar: bool
) -> tuple[list[dict[str, Any]], bool]:
    """(the results, in ``chosen``'s order, whether Ctrl-C stopped the runs). One after
    another, a Ctrl-C ends the current run (its report covers what ran) and skips the rest;
    side by side, it stops every run where it is."""
    results: list[dict[str, Any]] = []
    try:
        if jobs > 1:
            from services.planet.parallel import run_side_by_side

            results, interrupted = run_side_by_side(sc, chosen, jobs, run_one, progress=bar)
            for r in results:
                _print_line(r)
                _say_if_interrupted(r, sc)
            return results, interrupted
        for prof in chosen:
            results.append(run_with_bar(sc, prof, prof.stem, bar))
            _print_line(results[-1])
            if _say_if_interrupted(results[-1], sc):
                return results, True
    except KeyboardInterrupt:  # outside a run's event loop (building the world, summarising)
        print("interrupted", file=sys.stderr)
        return results, True
    return results, False


def _print_line(r: dict[str, Any]) -> None:
    print(
        f"{r['profile']:<16} TTFT p50 {r['ttft_ms']['p50']:>7.0f} ms  "
        f"p99 {r['ttft_ms']['p99']:>7.0f} ms  "
        f"goodput {100 * r['goodput']:5.1f} %  refused {r['refused_total']:>6}  "
        f"residency violations {r['residency_violations']}  "
        f"oscillation {r['oscillation']:.3f}  "
        f"{r['run']['simulated_requests_per_wall_s'] or 0:,.0f} req/wall-s  "
        f"{r['run']['simulated_requests_per_cpu_s'] or 0:,.0f} req/CPU-s  "
        f"RSS {r['run']['peak_rss_mib']:,.0f} MiB"
    )


def _say_if_interrupted(r: dict[str, Any], sc: Scenario) -> bool:
    stopped = r["run"]["interrupted_at_s"]
    if stopped is None:
        return False
    print(
        f"interrupted at {stopped:,.1f} s of {sc.duration_s:g} s simulated "
        f"({r['profile']}); the report covers what ran",
        file=sys.stderr,
    )
    return True


def calibration() -> int:
    from services.planet.geo import median
    from services.planet.world import calibrate, read_calibration, read_regions

    regions = read_regions(ROOT / "deploy/sim/regions.csv")
    model, residuals = calibrate(
        regions, read_calibration(ROOT / "deploy/sim/calibration.csv", regions)
    )
    print(f"path_stretch {model.path_stretch:.3f}, overhead {model.overhead_ms:.1f} ms")
    print(f"{'pair':<34} {'km':>6} {'measured':>9} {'model':>7} {'error':>7}")
    for r in sorted(residuals, key=lambda r: r.distance_km):
        print(f"{r.a + ' - ' + r.b:<34} {r.distance_km:>6.0f} {r.measured_ms:>7.1f}ms "
              f"{r.modelled_ms:>5.1f}ms {100 * r.relative_error:>+6.0f}%")  # fmt: skip
    errors = [abs(r.relative_error) for r in residuals]
    print(f"median |error| {100 * median(errors):.0f} %, max {100 * max(errors):.0f} %")
    return 0


def combine(paths: list[Path], out: Path, p: argparse.ArgumentParser) -> int:
    import json

    from services.planet.report import read_result, write_json, write_markdown

    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            loaded = json.loads(read_text(path))
        except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
            p.error(f"--combine: cannot read {path}: {err.reason}")
        except (ValueError, RecursionError) as err:
            p.error(f"--combine: {path}: not JSON: {err}")
        for result in loaded if isinstance(loaded, list) else [loaded]:
            problem = _not_a_result(result)
            if problem:
                p.error(f"--combine: {path}: not a bench.planet results.json: {problem}")
            results.append(read_result(result))
    if not results:
        p.error("--combine: the files hold no results")
    runs = {(r["scenario"], r["source"], r["duration_s"], r["engine"]) for r in results}
    if len(runs) > 1:  # one comparison table of different worlds would mislead
        listed = "; ".join(f"{n} ({src}, {d:g} s, {e})" for n, src, d, e in sorted(runs))
        p.error(f"--combine: the results are of different runs, not comparable: {listed}")
    names = [r["profile"] for r in results]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # the same file given twice, or two runs of one profile: one column each
        p.error(
            f"--combine: profile {', '.join(map(repr, repeated))} appears more than once; "
            "give each profile's results once"
        )
    prepare_out(out, p)
    try:  # the report first: a malformed nested value must not overwrite a good results.json
        report = write_markdown(results, out)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        p.error(f"--combine: a result is malformed ({type(err).__name__}: {err})")
    write_json(results, out / "results.json")
    print(f"report: {report}")
    return 0


# What ``services.planet.report`` reads from every result, with the type it must have.
_RESULT_KEYS: dict[str, type | tuple[type, ...]] = {
    "scenario": str,
    "source": str,
    "profile": str,
    "engine": str,
    "duration_s": (int, float),
    "fleet": dict,
    "slo": dict,
    "requests": int,
    "goodput": (int, float, type(None)),  # null: no requests at all
    "ttft_ms": dict,
    "itl_ms": dict,
    "e2e_ms": dict,
    "refused_total": int,
    "residency_violations": int,
    "oscillation": (int, float),
    "by_region": dict,
    "by_site": dict,
    "by_tier": dict,
    "series": list,
    "decisions_sampled": list,
    "run": dict,
}


def _not_a_result(result: object) -> str | None:
    """Why ``result`` is not one profile's result as ``bench.planet`` writes it (None if it is)."""
    if not isinstance(result, dict):
        return f"expected an object (or a list of them), got {type(result).__name__}"
    for key, kind in _RESULT_KEYS.items():
        if key not in result:
            return f"missing key {key!r}"
        if not isinstance(result[key], kind) or isinstance(result[key], bool):
            return f"{key!r} has the wrong type ({type(result[key]).__name__})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.planet", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, help="scenario YAML (e.g. deploy/sim/planet.yaml)")
    p.add_argument(
        "--profiles",
        nargs="+",
        default=None,
        help="router profiles (names under deploy/router/profiles or .yaml paths); the first is "
        "the one compared with the others; default: the scenario's",
    )
    p.add_argument("--duration", type=cli.positive_float, help="override duration_s")
    p.add_argument("--engine", choices=("fast", "exact"), help="override the engine model")
    p.add_argument(
        "--out",
        type=cli.output_dir,
        default=ROOT / "bench/results/tmp/planet",
        help="report folder (created if need be)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=1,
        help="run up to this many profiles side by side, one process each (a run uses one "
        "core; memory is checked for all of them together), or 'auto' (the cores this "
        "process may use); default 1: one after another",
    )
    p.add_argument("--calibration", action="store_true", help="print the RTT model's fit and exit")
    p.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="write one comparison report from earlier runs' results.json (profiles run in "
        "parallel processes); the first is the one compared with the others",
    )
    args = p.parse_args(argv)
    if args.calibration:
        return calibration()
    if args.combine:
        return combine(args.combine, args.out, p)
    if args.scenario is None:
        p.error("--scenario is required")
    profiles = [profile_path(n) for n in args.profiles] if args.profiles else None
    if profiles:
        missing = [n for n, x in zip(args.profiles, profiles, strict=True) if not x.exists()]
        if missing:
            shipped = ", ".join(sorted(x.stem for x in PROFILES.glob("*.yaml")))
            p.error(
                f"--profiles: no such profile: {', '.join(missing)} (shipped: {shipped}; "
                "or a path to a .yaml file)"
            )
        problem = twice(args.profiles, profiles) or check_profiles(profiles)
        if problem is not None:
            p.error(f"--profiles: {problem}")
    overrides: dict[str, Any] = {}
    if args.duration is not None:
        overrides["duration_s"] = args.duration
    if args.engine is not None:
        overrides["engine"] = args.engine
    try:
        sc = load_scenario(args.scenario, overrides=overrides)
        need = check_memory(sc, profiles or ())
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = None if profiles else check_profiles([sc.router.profile])
    if problem is not None:
        print(f"error: {sc.source}: router.profile: {problem}", file=sys.stderr)
        return 2
    prepare_out(args.out, p)
    from services.planet.demand import Demand
    from services.planet.report import write_json, write_markdown

    arrivals = Demand(sc, {}).expected_arrivals()
    print(
        f"{sc.name}: {len(sc.fleet_regions)} regions, {len(sc.workers):,} workers, "
        f"{len(sc.sites)} sites, {sc.duration_s:g} s, ~{arrivals:,.0f} requests per profile; "
        f"memory estimate {need:,.0f} MiB",
        file=sys.stderr,
    )
    if arrivals < 1:
        print(
            f"warning: {sc.source}: fewer than one request is expected in {sc.duration_s:g} s "
            "(traffic.rate_per_s, the sites' population_m, the diurnal weights at their local "
            "hours and the hotspot factors multiply together); the report will be empty",
            file=sys.stderr,
        )
    chosen = profiles or [sc.router.profile]
    jobs = _choose_jobs(args.jobs, chosen, sc, need)
    try:
        results, interrupted = _run_profiles(sc, chosen, jobs, not args.no_progress)
    except ProfileProcessDied as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not results:
        return 130
    try:
        write_json(results, args.out / "results.json")
        path = write_markdown(results, args.out)
    except KeyboardInterrupt:
        print("interrupted while writing the report", file=sys.stderr)
        return 130
    print(f"report: {path}  (JSON: {args.out / 'results.json'})")
    if interrupted:
        return 130
    if len(results) > 1:
        ours, rest = results[0], results[1:]
        best99 = min(rest, key=lambda r: r["ttft_ms"]["p99"])
        bestg = max(rest, key=lambda r: r["goodput"])
        print(
            f"{ours['profile']}: TTFT p99 {ours['ttft_ms']['p99'] / best99['ttft_ms']['p99']:.2f}x "
            f"{best99['profile']} (goal <= 0.5x); goodput "
            f"{ours['goodput'] / max(bestg['goodput'], 1e-9):.2f}x {bestg['profile']} "
            "(goal >= 1.3x)"
        )
    return 0
