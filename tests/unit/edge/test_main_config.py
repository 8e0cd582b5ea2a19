"""The edge's command line: what it refuses to start with, and that secrets stay secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.main import build_parser, config_from_args, main
from services.edge.ratelimit.limiter import FailureMode
from services.edge.server import EdgeConfig

BASE = ["--redis-url", "redis://127.0.0.1:1/0", "--router", "127.0.0.1:2"]


def parse(*extra: str) -> EdgeConfig:
    return config_from_args(build_parser().parse_args([*BASE, *extra]))


def test_plain_http_must_be_asked_for() -> None:
    with pytest.raises(ValueError, match="TLS is required"):
        parse()
    assert parse("--plain-http").tls is None


def test_tls_files_come_in_pairs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        parse("--tls-cert", str(tmp_path / "c"))
    config = parse("--tls-cert", str(tmp_path / "c"), "--tls-key", str(tmp_path / "k"))
    assert config.tls is not None
    assert config.tls.min_version == "1.2"


def test_the_admin_api_needs_a_long_enough_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MERIDIAN_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValueError, match="admin-token-file"):
        parse("--plain-http", "--admin-port", "0")
    short = tmp_path / "token"
    short.write_text("tiny\n")
    with pytest.raises(ValueError, match="at least 16") as err:
        parse("--plain-http", "--admin-port", "0", "--admin-token-file", str(short))
    assert "tiny" not in str(err.value)
    monkeypatch.setenv("MERIDIAN_ADMIN_TOKEN", "a-long-enough-admin-token")
    config = parse("--plain-http", "--admin-port", "0")
    assert config.admin_token == "a-long-enough-admin-token"
    assert "a-long-enough-admin-token" not in repr(config)


def test_limits_and_failure_modes_reach_the_config() -> None:
    config = parse(
        "--plain-http",
        "--redis-failure-mode",
        "closed",
        "--local-limit-share",
        "0.25",
        "--max-streams-per-ip",
        "3",
        "--header-timeout-s",
        "2.5",
        "--max-messages",
        "10",
    )
    assert config.ratelimit.failure_mode is FailureMode.CLOSED
    assert config.ratelimit.local_share == 0.25
    assert config.guard.max_streams_per_ip == 3
    assert config.guard.header_timeout_s == 2.5
    assert config.request_limits.max_messages == 10


def test_sse_keepalive_timings_reach_the_config() -> None:
    default = parse("--plain-http")
    assert (default.keepalive_after_s, default.keepalive_every_s) == (3.0, 10.0)
    config = parse("--plain-http", "--sse-keepalive-after-s", "1", "--sse-keepalive-every-s", "4")
    assert (config.keepalive_after_s, config.keepalive_every_s) == (1.0, 4.0)


def test_streams_go_over_generate_mux_unless_told_otherwise() -> None:
    assert parse("--plain-http").worker_transport == "mux"
    assert parse("--plain-http", "--worker-transport", "call").worker_transport == "call"


@pytest.mark.parametrize(
    "bad",
    [
        ["--max-streams", "0"],
        ["--header-timeout-s", "-1"],
        ["--redis-failure-mode", "maybe"],
        ["--port", "70000"],
        ["--worker-transport", "carrier-pigeon"],
        ["--sse-keepalive-every-s", "0"],
        ["--sse-keepalive-every-s", "nan"],
        ["--sse-keepalive-after-s", "5000"],  # milliseconds, by mistake
    ],
)
def test_bad_values_stop_the_parser(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, "--plain-http", *bad])


def test_a_missing_pepper_stops_the_edge_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MERIDIAN_KEY_PEPPER", raising=False)
    with pytest.raises(SystemExit):
        main([*BASE, "--plain-http"])
    assert "no key pepper" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--key-pepper-file", "--admin-token-file"])
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe" + b"p" * 40, "not UTF-8 text (byte 0xff at offset 0)"),
        (None, "No such file or directory"),
        ("dir", "Is a directory"),
    ],
)
def test_a_secret_file_that_cannot_be_read_stops_the_edge_naming_the_flag_and_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    content: bytes | str | None,
    reason: str,
) -> None:
    monkeypatch.setenv("MERIDIAN_KEY_PEPPER", "p" * 40)
    monkeypatch.setenv("MERIDIAN_ADMIN_TOKEN", "a-long-enough-admin-token")
    secret = tmp_path / "secret"
    if content == "dir":
        secret.mkdir()
    elif isinstance(content, bytes):
        secret.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main([*BASE, "--plain-http", "--admin-port", "0", flag, str(secret)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {flag} {secret}: {reason}\n" in err
    assert "Traceback" not in err
