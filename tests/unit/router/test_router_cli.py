"""The router's command line: discovery flags, the debug endpoint's settings and token rules,
and the ``/debug/route`` query string (validated like the Route RPC)."""

from __future__ import annotations

from pathlib import Path

import pytest
from multidict import MultiDict

from meridian.v1 import router_pb2
from services.router.debug import DebugConfig
from services.router.debug.endpoint import BadParam, route_request_from_query
from services.router.discovery.dns import DnsTarget
from services.router.main import (
    TOKEN_ENV,
    build_parser,
    check_sources,
    debug_config,
    main,
    router_config,
)

TOKEN = "s3cret-token-0123456789"


def test_every_discovery_source_reaches_the_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "--worker",
            "127.0.0.1:7001",
            "--worker-dns",
            "workers.kr.svc.cluster.local:7000",
            "--dns-interval-ms",
            "2000",
            "--announce-dir",
            str(tmp_path),
            "--announce-interval-ms",
            "500",
            "--probe-interval-ms",
            "100",
        ]
    )
    assert check_sources(args) is None
    cfg = router_config(args, None).discovery
    assert cfg.static == ("127.0.0.1:7001",)
    assert cfg.dns == (DnsTarget("workers.kr.svc.cluster.local", 7000),)
    assert (cfg.dns_interval_s, cfg.announce_interval_s) == (2.0, 0.5)
    assert cfg.announce_dir == tmp_path
    assert cfg.watch.probe_interval_s == 0.1


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        ([], "no workers to watch"),
        (["--announce-dir", "/etc/hostname"], "not a directory"),
    ],
)
def test_unusable_discovery_flags_are_refused(argv: list[str], problem: str) -> None:
    assert problem in (check_sources(build_parser().parse_args(argv)) or "")


@pytest.mark.parametrize(
    "argv",
    [
        ["--worker-dns", "no-port"],
        ["--worker-dns", "name:0"],
        ["--dns-interval-ms", "5"],
        ["--debug-port", "70000"],
    ],
)
def test_bad_flag_values_exit_with_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--worker", "127.0.0.1:7001", *argv])
    assert exc.value.code == 2


def test_no_debug_port_means_no_debug_endpoint() -> None:
    args = build_parser().parse_args(["--worker", "127.0.0.1:7001"])
    assert debug_config(args, {}) is None


def test_the_debug_token_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    base = ["--worker", "127.0.0.1:7001", "--debug-port", "0", "--debug-host", "0.0.0.0"]
    from_file = debug_config(
        build_parser().parse_args([*base, "--debug-token-file", str(token_file)]), {}
    )
    from_env = debug_config(build_parser().parse_args(base), {TOKEN_ENV: TOKEN})
    assert from_file == from_env == DebugConfig(host="0.0.0.0", port=0, token=TOKEN)


def test_a_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["--worker", "127.0.0.1:7001", "--debug-port", "0", "--debug-token-file", "/nonexistent"]
    )
    with pytest.raises(ValueError, match="--debug-token-file"):
        debug_config(args, {})


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"host": "0.0.0.0"}, "needs a token"),
        ({"host": "10.0.0.5"}, "needs a token"),
        ({"token": "short"}, "at least 16"),
        ({"port": 70000}, "0..65535"),
    ],
)
def test_the_debug_endpoint_is_never_exposed_by_accident(
    kwargs: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        DebugConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]"])
def test_loopback_needs_no_token(host: str) -> None:
    assert DebugConfig(host=host).token is None


def test_main_refuses_a_public_debug_port_without_a_token() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--worker", "127.0.0.1:7001", "--debug-port", "0", "--debug-host", "0.0.0.0"], {})
    assert exc.value.code == 2


def test_main_refuses_a_broken_profile(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("profiles: {default: {filters: []}}")
    with pytest.raises(SystemExit) as exc:
        main(["--worker", "127.0.0.1:7001", "--profile", str(profile)], {})
    assert exc.value.code == 2


def test_main_refuses_a_profile_that_is_not_utf8_naming_the_flag_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit) as exc:
        main(["--worker", "127.0.0.1:7001", "--profile", str(profile)], {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --profile {profile}: " in err
    assert "cannot read: not UTF-8 text (byte 0xff at offset 0)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [b"\xff\xfe", None])
def test_a_token_file_that_is_not_utf8_or_is_a_folder_names_the_flag_and_file(
    tmp_path: Path, content: bytes | None, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "token"
    if content is None:
        token_file.mkdir()
    else:
        token_file.write_bytes(content)
    argv = ["--worker", "127.0.0.1:7001", "--debug-port", "0", "--debug-token-file"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, str(token_file)], {})
    assert exc.value.code == 2
    assert f"error: --debug-token-file {token_file}: " in capsys.readouterr().err


def test_a_debug_route_query_becomes_a_route_request() -> None:
    req, explain = route_request_from_query(
        MultiDict(
            model="m",
            priority="HIGH",
            allowed_regions="kr, jp",
            client_region="kr",
            edge_site="seoul",
            prompt_tokens="900",
            max_tokens="64",
            exclude="kr-1",
            explain="0",
        )
    )
    assert not explain
    assert req.model == "m"
    assert req.priority == router_pb2.PRIORITY_HIGH
    assert list(req.allowed_regions) == ["kr", "jp"]
    assert list(req.exclude_worker_ids) == ["kr-1"]
    assert (req.prompt_tokens, req.max_tokens) == (900, 64)
    assert (req.client_region, req.edge_site) == ("kr", "seoul")


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"model": "m", "priority": "urgent"}, "priority"),
        ({"model": "m", "prompt_tokens": "-1"}, "prompt_tokens"),
        ({"model": "m", "max_tokens": "many"}, "max_tokens"),
        ({"model": "m", "explain": "maybe"}, "explain"),
        ({"model": "m", "session_id": "abc"}, "session_id"),
        ({"model": "m", "prefix_hashes": "1,2"}, "prefix_hashes"),
    ],
)
def test_bad_debug_route_queries_name_the_parameter(query: dict[str, str], param: str) -> None:
    with pytest.raises(BadParam) as exc:
        route_request_from_query(MultiDict(query))
    assert exc.value.param == param


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"MERIDIAN_TRACER": "bogus"}, "MERIDIAN_TRACER 'bogus' is not one of"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER 'sometimes' is not one of"),
    ],
)
def test_main_refuses_bad_telemetry_settings_with_exit_2_before_starting(
    env: dict[str, str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """MERIDIAN_TRACER was found only once the router was starting: exit 1, not a usage error."""
    with pytest.raises(SystemExit) as exc:
        main(["--worker", "127.0.0.1:7001"], env)
    assert exc.value.code == 2
    assert problem in capsys.readouterr().err
