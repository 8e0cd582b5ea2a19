"""The ``--workers`` supervisor's pure parts: the count, each child's command line and ports,
and what is divided among the processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.common.cpus import cgroup_cpu_quota, usable_cpus
from services.edge.main import build_parser, config_from_args
from services.edge.supervisor import (
    MAX_AUTO_WORKERS,
    Child,
    Supervisor,
    SupervisorConfig,
    offset_port,
    parse_workers,
    strip_workers,
)

BASE = ["--plain-http", "--redis-url", "redis://127.0.0.1:1", "--router", "127.0.0.1:1"]


def test_workers_is_a_count_or_auto() -> None:
    assert parse_workers("3") == 3
    assert parse_workers("auto") == min(usable_cpus(), MAX_AUTO_WORKERS)
    for bad in ("0", "257", "-2", "two", ""):
        with pytest.raises(ValueError, match="'auto' or a count"):
            parse_workers(bad)


def test_children_are_single_edges() -> None:
    argv = ["--port", "8080", "--workers", "4", "--workers=2", "--site", "seoul"]
    assert strip_workers(argv) == ("--port", "8080", "--site", "seoul")


def test_each_child_gets_the_shared_port_and_its_own_listeners(tmp_path: Path) -> None:
    sup = Supervisor(
        SupervisorConfig(
            argv=("--site", "seoul", "--port", "0"),
            workers=3,
            host="127.0.0.1",
            port=0,
            admin_port=9090,
            metrics_port=0,
            ready_file=None,
            drain_grace_s=5.0,
        )
    )
    sup.port = 45000  # what the reservation found
    argv = sup.child_argv(Child(2, tmp_path / "edge-2.json"))
    args = build_parser().parse_args([*BASE, *argv[3:]])  # after "python -m services.edge"
    assert argv[1:3] == ["-m", "services.edge"]
    assert (args.port, args.admin_port, args.metrics_port) == (45000, 9092, 0)
    assert (args.process_index, args.process_count) == (2, 3)
    assert args.ready_file == tmp_path / "edge-2.json"
    assert args.site == "seoul"


def test_per_process_ports_offset_by_index_but_any_free_port_stays_any() -> None:
    assert offset_port(9090, 3) == 9093
    assert offset_port(0, 3) == 0
    assert offset_port(None, 3) is None


def test_the_local_limit_share_is_divided_among_the_processes() -> None:
    args = build_parser().parse_args(
        [*BASE, "--local-limit-share", "0.8", "--process-index", "1", "--process-count", "4"]
    )
    config = config_from_args(args)
    assert config.ratelimit.local_share == pytest.approx(0.2)
    assert config.reuse_port
    single = config_from_args(build_parser().parse_args(BASE))
    assert single.ratelimit.local_share == 1.0
    assert not single.reuse_port


def test_auto_honours_a_cgroup_v2_cpu_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: two processes
    assert cgroup_cpu_quota(tmp_path) == 1.5
    assert usable_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_an_unlimited_or_missing_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path) is None  # neither v2 nor v1 files
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_auto_honours_a_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.0
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path) is None
