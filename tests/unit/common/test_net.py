"""Addresses and URLs as the services parse and show them."""

from __future__ import annotations

from services.common.net import redact_url


def test_a_url_shown_to_a_person_never_carries_its_password() -> None:
    assert redact_url("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert redact_url("rediss://app:s3cret@cache:6380") == "rediss://app:***@cache:6380"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("unix:///run/redis.sock") == "unix:///run/redis.sock"
