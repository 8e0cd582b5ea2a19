"""The benchmarks' command lines refuse bad flags with argparse's one-line error and exit 2
before they start anything (a NaN latency, a zero concurrency or an unknown system used to
end in a ZeroDivisionError traceback after minutes of set-up, or run nothing and say so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.interrupt import start_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["bench.peers", "--ttft-ms", "nan"], "argument --ttft-ms: must be a finite number"),
        (["bench.peers", "--concurrency", "8", "0"], "argument --concurrency: must be >= 1"),
        (["bench.peers", "--tokens", "1"], "argument --tokens: must be >= 2, got 1"),
        (["bench.peers", "--systems", "meridian,envoy"], "--systems: unknown ['envoy']"),
        (["bench.peers", "--out", "{file}"], "is not a directory"),
        (["bench.overhead", "--concurrency", "0"], "argument --concurrency: must be >= 1"),
        (["bench.overhead", "--requests", "ten"], "argument --requests: 'ten' is not an integer"),
        (["bench.chaos", "--fault-s", "inf"], "argument --fault-s: must be a finite number"),
        (["bench.routing_quality", "--flood", "-1"], "argument --flood: must be >= 0, got -1"),
        (["bench.routing_quality", "--attempts", "0"], "argument --attempts: must be >= 1"),
        (["bench.planet_fidelity", "--profiles", "nope"], "no such profile under"),
        (["bench.planet_fidelity", "--write-trace", "{dir}"], "is a directory, not a file"),
        (["bench.planet_fidelity", "--rate", "nan"], "argument --rate: must be a finite number"),
        (
            ["bench.planet_fidelity", "--rate", "1000", "--duration", "3600", "--sim-only"],
            "--rate x --duration plans 3,600,000 requests, more than 100,000",
        ),
        (["bench.routing_quality", "--rate", "1e9"], "argument --rate: must be within (0, 1000]"),
        (["bench.routing_quality", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        (["bench.router_cpu", "--seconds", "nan"], "argument --seconds: must be a finite number"),
        (["bench.router_cpu", "--rates", "20", "0"], "argument --rates: must be within (0, 10000]"),
        (["bench.router_cpu", "--workers", "0"], "argument --workers: must be within [1, 64]"),
        (["bench.router_cpu_ab", "a", "b", "--rate", "-5"], "argument --rate: must be within"),
        (["bench.sim_engine", "--rates", "2,x"], "argument --rates: 'x' is not a number"),
        (["bench.sim_engine", "--seconds", "inf"], "argument --seconds: must be a finite number"),
        (["bench.edge_pipeline", "--concurrency", "0"], "argument --concurrency: must be within"),
        (["bench.edge_pipeline", "--seconds", "-1"], "argument --seconds: must be within"),
        (["bench.embeddings_overhead", "--inputs", "5000"], "argument --inputs: must be within"),
        (["bench.console_idle", "--rate", "nan"], "argument --rate: must be a finite number"),
        (["bench.telemetry_overhead", "--rounds", "0"], "argument --rounds: must be within"),
        (["bench.vllm_vs_serve", "--pairs", "x"], "argument --pairs: 'x' is not an integer"),
        (["bench.fake_openai", "--port", "70000"], "argument --port: must be within [0, 65535]"),
        (["bench.token_framing", "--window-s", "nan"], "argument --window-s: must be a finite"),
        (["bench.router_rpc", "--calls", "0"], "argument --calls: must be >= 1, got 0"),
        (["bench.chaos", "--streams", "-2"], "argument --streams: must be >= 1, got -2"),
        (["services.localstack.compose", "chaos", "--clients", "0"], "argument --clients: must be"),
    ],
)
def test_a_benchmark_refuses_a_bad_flag_before_it_starts(
    tmp_path: Path, argv: list[str], problem: str
) -> None:
    (tmp_path / "file").write_text("keep me")
    names = {"file": str(tmp_path / "file"), "dir": str(tmp_path)}
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'build' / 'gen'}"}
    done = subprocess.run(
        [sys.executable, "-m", *(a.format(**names) for a in argv)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert problem in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "file").read_text() == "keep me"


def test_ctrl_c_ends_a_benchmark_in_one_line_as_interrupted() -> None:
    import signal
    import time

    proc = start_module("bench.sim_engine", "--seconds", "86400", "--rates", "40")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("SimConfig defaults")  # it is running
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert stderr == "interrupted\n"
    assert proc.returncode == -signal.SIGINT  # ended by the signal: 130 in a shell


def test_telemetry_overhead_help_lists_the_modes() -> None:
    # Its --modes help names "traces 5%", and argparse %-formats help strings: --help
    # (what docs/observability.md sends a user to first) used to end in a ValueError.
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'build' / 'gen'}"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.telemetry_overhead", "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'traces 5%'" in done.stdout
    assert "Traceback" not in done.stderr
