from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.tenancy.apikeys import (
    PEPPER_ENV,
    KeyHasher,
    KeyRecord,
    load_pepper,
    looks_like_key,
    new_pepper,
    new_raw_key,
)
from services.edge.tenancy.tenants import Limits


def test_new_keys_have_the_meridian_format_and_are_distinct() -> None:
    keys = {new_raw_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(looks_like_key(k) for k in keys)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "mk-",
        "sk-" + "a" * 43,
        "mk-" + "a" * 42,
        "mk-" + "a" * 44,
        "mk-" + "a" * 42 + "!",
        "mk-" + "a" * 43 + "\n",
    ],
)
def test_keys_in_another_format_are_recognised_without_a_lookup(raw: str) -> None:
    assert not looks_like_key(raw)


def test_the_digest_is_keyed_by_the_pepper() -> None:
    raw = new_raw_key()
    one, two = KeyHasher(b"pepper-one-0123456789"), KeyHasher(b"pepper-two-0123456789")
    assert one.digest(raw) == one.digest(raw)
    assert one.digest(raw) != two.digest(raw)
    assert raw not in one.digest(raw)
    assert "pepper-one" not in repr(one)


def test_short_peppers_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        KeyHasher(b"short")


def test_the_pepper_comes_from_a_file_or_the_environment_and_errors_never_show_it(
    tmp_path: Path,
) -> None:
    secret = new_pepper()
    path = tmp_path / "pepper"
    path.write_text(secret + "\n")
    assert load_pepper(file=path) == secret.encode()
    assert load_pepper(file=None, env={PEPPER_ENV: secret}) == secret.encode()
    with pytest.raises(ValueError, match="no key pepper") as missing:
        load_pepper(file=None, env={})
    with pytest.raises(ValueError, match="shorter") as short:
        load_pepper(file=None, env={PEPPER_ENV: "tiny-secret"})
    assert "tiny-secret" not in str(short.value)
    assert secret not in str(missing.value)
    with pytest.raises(ValueError, match="cannot read"):
        load_pepper(file=tmp_path / "absent")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + b"x" * 30)
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_pepper(file=tmp_path / "binary")


def test_a_key_record_round_trips_through_redis_fields() -> None:
    record = KeyRecord(
        key_id="abc",
        tenant="acme",
        name="ci",
        created_ms=5,
        expires_ms=10,
        limits=Limits(rpm=3),
    )
    fields = {k.encode(): v.encode() for k, v in record.to_fields().items()}
    assert KeyRecord.from_fields(fields) == record  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expires_ms", "revoked_ms", "now_ms", "usable"),
    [
        (None, None, 100, True),
        (200, None, 199, True),
        (200, None, 200, False),
        (None, 50, 100, False),
    ],
)
def test_a_key_is_usable_until_it_expires_or_is_revoked(
    expires_ms: int | None, revoked_ms: int | None, now_ms: int, usable: bool
) -> None:
    record = KeyRecord(key_id="k", tenant="t", expires_ms=expires_ms, revoked_ms=revoked_ms)
    assert record.usable(now_ms) is usable
