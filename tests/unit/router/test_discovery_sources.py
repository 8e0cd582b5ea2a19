"""Discovery sources feeding one Membership: DNS names (system resolver and a table), the
announcement directory, and the union rule (an address is watched while any source lists it).

Addresses here need not listen: a watcher of a closed port just keeps retrying, which is all
membership needs. Tests against live workers are in tests/integration/test_router_discovery.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common import runtime
from services.common.clock import SYSTEM_CLOCK
from services.router.discovery.announce import (
    AnnounceDirDiscovery,
    AnnouncementError,
    parse_announcement,
    scan_directory,
)
from services.router.discovery.dns import (
    DnsDiscovery,
    DnsTarget,
    NameNotFound,
    ResolveError,
    SystemResolver,
    format_address,
)
from services.router.discovery.membership import Membership
from services.router.fleet import Fleet
from tests.support.resolver import TableResolver


@pytest.fixture
async def membership() -> AsyncIterator[tuple[Membership, Fleet]]:
    fleet = Fleet()
    m = Membership(fleet=fleet, clock=SYSTEM_CLOCK)
    yield m, fleet
    await m.stop()


# --- DNS ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("workers.kr.svc.cluster.local:7000", "workers.kr.svc.cluster.local", 7000),
        ("worker:50061", "worker", 50061),
        ("127.0.0.1:80", "127.0.0.1", 80),
        ("[::1]:9000", "::1", 9000),
    ],
)
def test_dns_targets_parse(value: str, host: str, port: int) -> None:
    assert DnsTarget.parse(value) == DnsTarget(host, port)


@pytest.mark.parametrize("value", ["worker", "worker:0", "worker:99999", "bad name:80", ":80"])
def test_bad_dns_targets_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT|invalid host"):
        DnsTarget.parse(value)


@pytest.mark.parametrize(
    ("ip", "expected"),
    [("10.1.2.3", "10.1.2.3:7000"), ("::1", "[::1]:7000"), ("fd00::5", "[fd00::5]:7000")],
)
def test_resolved_addresses_are_formatted_for_grpc(ip: str, expected: str) -> None:
    assert format_address(ip, 7000) == expected


async def test_the_system_resolver_resolves_localhost() -> None:
    addresses = await SystemResolver().resolve("localhost", 7000)
    assert "127.0.0.1:7000" in addresses


async def test_the_system_resolver_says_when_a_name_does_not_exist() -> None:
    with pytest.raises(NameNotFound):
        await SystemResolver().resolve("no-such-worker.invalid", 7000)


async def test_a_name_adds_every_address_it_resolves_to(
    membership: tuple[Membership, Fleet],
) -> None:
    m, fleet = membership
    resolver = TableResolver()
    resolver.table["workers"] = ["127.0.0.1", "127.0.0.2"]
    dns = DnsDiscovery(targets=[DnsTarget("workers", 1)], membership=m, resolver=resolver)
    await dns.refresh()
    assert m.addresses() == {"127.0.0.1:1", "127.0.0.2:1"}
    assert sorted(fleet.addresses()) == ["127.0.0.1:1", "127.0.0.2:1"]


async def test_re_resolution_follows_scaling_up_and_down(
    membership: tuple[Membership, Fleet],
) -> None:
    m, _fleet = membership
    resolver = TableResolver()
    resolver.table["workers"] = ["127.0.0.1"]
    dns = DnsDiscovery(targets=[DnsTarget("workers", 1)], membership=m, resolver=resolver)
    await dns.refresh()
    resolver.table["workers"] = ["127.0.0.1", "127.0.0.3"]
    await dns.refresh()
    assert m.addresses() == {"127.0.0.1:1", "127.0.0.3:1"}
    resolver.table["workers"] = ["127.0.0.3"]
    await dns.refresh()
    assert m.addresses() == {"127.0.0.3:1"}


@pytest.mark.parametrize(
    ("failure", "kept"),
    [
        (ResolveError("workers: timeout"), {"127.0.0.1:1"}),  # a hiccup keeps the last answer
        (NameNotFound("workers: NXDOMAIN"), set()),  # no address at all: nothing to watch
    ],
)
async def test_resolution_failures_keep_or_drop_the_last_answer(
    membership: tuple[Membership, Fleet], failure: ResolveError, kept: set[str]
) -> None:
    m, _ = membership
    resolver = TableResolver()
    resolver.table["workers"] = ["127.0.0.1"]
    dns = DnsDiscovery(targets=[DnsTarget("workers", 1)], membership=m, resolver=resolver)
    await dns.refresh()
    resolver.table["workers"] = failure
    await dns.refresh()
    assert m.addresses() == kept


async def test_the_background_task_re_resolves_periodically(
    membership: tuple[Membership, Fleet],
) -> None:
    from tests.support.wait import eventually

    m, _ = membership
    resolver = TableResolver()
    resolver.table["workers"] = ["127.0.0.1"]
    dns = DnsDiscovery(
        targets=[DnsTarget("workers", 1)], membership=m, resolver=resolver, interval_s=0.02
    )
    dns.start()
    try:
        await eventually(lambda: m.addresses() == {"127.0.0.1:1"})
        resolver.table["workers"] = ["127.0.0.9"]
        await eventually(lambda: m.addresses() == {"127.0.0.9:1"})
        assert resolver.calls >= 2
    finally:
        await dns.stop()


def test_dns_discovery_refuses_a_non_positive_interval() -> None:
    fleet = Fleet()
    m = Membership(fleet=fleet, clock=SYSTEM_CLOCK)
    with pytest.raises(ValueError, match="interval_s"):
        DnsDiscovery(targets=[], membership=m, interval_s=0)


# --- membership ---------------------------------------------------------------------------


async def test_an_address_stays_watched_while_any_source_lists_it(
    membership: tuple[Membership, Fleet],
) -> None:
    m, _fleet = membership
    m.update("static", ["127.0.0.1:1"])
    m.update("dns:workers:1", ["127.0.0.1:1", "127.0.0.2:1"])
    m.update("dns:workers:1", [])
    assert m.addresses() == {"127.0.0.1:1"}
    assert m.sources() == {"static": frozenset({"127.0.0.1:1"})}
    m.update("static", [])
    assert m.addresses() == frozenset()


# --- announcements ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ('{"pid": 42, "host": "127.0.0.1", "port": 50061}', "127.0.0.1:50061"),  # ready file
        ('{"address": "10.0.3.7:7000"}', "10.0.3.7:7000"),
        ('{"address": "worker-3.kr.internal:7000"}', "worker-3.kr.internal:7000"),
        ('{"host": "::1", "port": 7000}', "[::1]:7000"),
    ],
)
def test_announcements_name_an_address(text: str, address: str) -> None:
    assert parse_announcement(text) == address


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not JSON"),
        ("[" * 100_000, "not usable JSON"),  # nested past the stack: a RecursionError killed
        ('{"port": ' + "9" * 5000 + "}", "not usable JSON"),  # the scan task before
        ("[1, 2]", "JSON object"),
        ('{"host": "127.0.0.1"}', "needs 'address'"),
        ('{"host": "127.0.0.1", "port": "80"}', "needs 'address'"),
        ('{"host": "127.0.0.1", "port": true}', "needs 'address'"),
        ('{"address": 7000}', "must be a string"),
        ('{"address": "127.0.0.1:0"}', "port in 1..65535"),
        ('{"host": "0.0.0.0", "port": 7000}', "wildcard host"),
        ('{"host": "::", "port": 7000}', "wildcard host"),
    ],
)
def test_bad_announcements_say_why(text: str, problem: str) -> None:
    with pytest.raises(AnnouncementError, match=problem):
        parse_announcement(text)


def test_a_scan_reads_json_files_and_skips_the_rest(tmp_path: Path) -> None:
    runtime.write_ready_file(tmp_path / "kr-1.json", {"host": "127.0.0.1", "port": 7001})
    (tmp_path / "kr-2.json").write_text(json.dumps({"address": "127.0.0.1:7002"}))
    (tmp_path / "kr-3.json.tmp").write_text(json.dumps({"address": "127.0.0.1:7003"}))
    (tmp_path / "notes.txt").write_text("not an announcement")
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "huge.json").write_text(" " * 70_000)
    (tmp_path / "dir.json").mkdir()
    scan = scan_directory(tmp_path)
    assert scan.addresses == {"kr-1.json": "127.0.0.1:7001", "kr-2.json": "127.0.0.1:7002"}
    assert set(scan.problems) == {"broken.json", "huge.json"}
    assert "larger than" in scan.problems["huge.json"][1]


def test_a_missing_directory_scans_as_empty(tmp_path: Path) -> None:
    scan = scan_directory(tmp_path / "absent")
    assert scan.missing
    assert scan.addresses == {}


async def test_files_appearing_and_disappearing_change_membership(
    tmp_path: Path, membership: tuple[Membership, Fleet]
) -> None:
    m, _ = membership
    announce = AnnounceDirDiscovery(directory=tmp_path, membership=m)
    await announce.refresh()
    assert m.addresses() == frozenset()
    runtime.write_ready_file(tmp_path / "kr-1.json", {"host": "127.0.0.1", "port": 7001})
    runtime.write_ready_file(tmp_path / "kr-2.json", {"host": "127.0.0.1", "port": 7002})
    await announce.refresh()
    assert m.addresses() == {"127.0.0.1:7001", "127.0.0.1:7002"}
    (tmp_path / "kr-1.json").unlink()
    await announce.refresh()
    assert m.addresses() == {"127.0.0.1:7002"}
    assert m.sources() == {"announce": frozenset({"127.0.0.1:7002"})}


def test_an_unreadable_directory_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    scan = scan_directory(not_a_dir)
    assert scan.error is not None
    assert "cannot list" in scan.error


async def test_an_unreadable_directory_keeps_the_last_membership(
    tmp_path: Path, membership: tuple[Membership, Fleet]
) -> None:
    m, _ = membership
    directory = tmp_path / "workers"
    directory.mkdir()
    runtime.write_ready_file(directory / "kr-1.json", {"host": "127.0.0.1", "port": 7001})
    announce = AnnounceDirDiscovery(directory=directory, membership=m)
    await announce.refresh()
    (directory / "kr-1.json").unlink()
    directory.rmdir()
    directory.write_text("now a file")  # listing it fails
    await announce.refresh()
    assert m.addresses() == {"127.0.0.1:7001"}


def test_an_overlong_dns_label_is_refused() -> None:
    with pytest.raises(ValueError, match="63"):
        DnsTarget.parse("a" * 64 + ".example:80")
