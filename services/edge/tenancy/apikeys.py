"""API keys: their format, how they are hashed, and the record stored for each.

A key looks like ``mk-`` + 43 URL-safe characters (256 random bits). It is never stored or
logged: Redis holds only ``HMAC-SHA256(pepper, key)``, where the *pepper* is a server-side
secret loaded from a file or the environment (never from Redis, never logged). A dump of Redis
alone therefore cannot even confirm a guessed key. Because keys are high-entropy random
strings, a fast keyed hash is the right tool (there is nothing to brute-force; a slow KDF would
only cost every request).

Lookup is *by* digest (the Redis key name), so no raw key or digest is compared character by
character anywhere; ``key_id`` — the first 12 hex characters of the digest — names a key in
logs, the admin API and rate-limit state.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.edge.tenancy.tenants import Limits

KEY_PREFIX = "mk-"
_KEY_RE = re.compile(r"^mk-[A-Za-z0-9_-]{43}$")
KEY_ID_CHARS = 12
PEPPER_ENV = "MERIDIAN_KEY_PEPPER"
MIN_PEPPER_BYTES = 16


def new_raw_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def looks_like_key(raw: str) -> bool:
    return bool(_KEY_RE.fullmatch(raw))


def new_pepper() -> str:
    """A fresh pepper, printable (for a file or an environment variable)."""
    return secrets.token_urlsafe(32)


class KeyHasher:
    """``HMAC-SHA256(pepper, key)``, hex. Holds the pepper; never shows it."""

    __slots__ = ("_pepper",)

    def __init__(self, pepper: bytes) -> None:
        if len(pepper) < MIN_PEPPER_BYTES:
            raise ValueError(f"the key pepper must be at least {MIN_PEPPER_BYTES} bytes")
        self._pepper = pepper

    def digest(self, raw: str) -> str:
        return hmac.new(self._pepper, raw.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "KeyHasher(pepper=<hidden>)"


def load_pepper(*, file: Path | None, env: Mapping[str, str] = os.environ) -> bytes:
    """The pepper from ``file`` (first line) or else ``$MERIDIAN_KEY_PEPPER``.

    Raises ValueError, naming the source but never the value, if neither gives one that is
    long enough.
    """
    if file is not None:
        try:
            value = file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise ValueError(f"cannot read the key pepper file {file}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            raise ValueError(
                f"the key pepper file {file} is not UTF-8 text (byte {err.start})"
            ) from None
        source = str(file)
    else:
        value = env.get(PEPPER_ENV, "").strip()
        source = f"${PEPPER_ENV}"
    if not value:
        raise ValueError(f"no key pepper: set {PEPPER_ENV} or pass a pepper file")
    if len(value.encode()) < MIN_PEPPER_BYTES:
        raise ValueError(f"the key pepper from {source} is shorter than {MIN_PEPPER_BYTES} bytes")
    return value.encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRecord:
    """What Redis knows about a key (never the key itself)."""

    key_id: str
    tenant: str
    name: str = ""
    created_ms: int = 0
    expires_ms: int | None = None  # set by rotation with a grace period, or at creation
    revoked_ms: int | None = None
    limits: Limits | None = field(default=None)  # overrides the tenant's per-key limits
    rotated_to: str = ""  # the key id of its successor, once rotated (a key rotates once)

    def usable(self, now_ms: int) -> bool:
        if self.revoked_ms is not None:
            return False
        return self.expires_ms is None or now_ms < self.expires_ms

    def to_fields(self) -> dict[str, str]:
        out = {"key_id": self.key_id, "tenant": self.tenant, "name": self.name}
        out["created_ms"] = str(self.created_ms)
        if self.expires_ms is not None:
            out["expires_ms"] = str(self.expires_ms)
        if self.revoked_ms is not None:
            out["revoked_ms"] = str(self.revoked_ms)
        if self.limits is not None:
            out["limits"] = self.limits.model_dump_json()
        if self.rotated_to:
            out["rotated_to"] = self.rotated_to
        return out

    @classmethod
    def from_fields(cls, fields: Mapping[bytes | str, bytes | str]) -> KeyRecord:
        def text(name: str) -> str:
            value = fields.get(name.encode(), fields.get(name))
            if value is None:
                return ""
            return value.decode() if isinstance(value, bytes) else value

        def number(name: str) -> int | None:
            value = text(name)
            return int(value) if value else None

        limits = text("limits")
        return cls(
            key_id=text("key_id"),
            tenant=text("tenant"),
            name=text("name"),
            created_ms=number("created_ms") or 0,
            expires_ms=number("expires_ms"),
            revoked_ms=number("revoked_ms"),
            limits=Limits.model_validate_json(limits) if limits else None,
            rotated_to=text("rotated_to"),
        )

    def public(self) -> dict[str, object]:
        """The admin API's view of the record."""
        return {
            "key_id": self.key_id,
            "tenant": self.tenant,
            "name": self.name,
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "revoked_ms": self.revoked_ms,
            "limits": self.limits.model_dump() if self.limits else None,
            "rotated_to": self.rotated_to or None,
        }
