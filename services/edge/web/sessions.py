"""Console sessions: the admin token, typed once into a plain HTML form, becomes a session
cookie that JavaScript cannot read.

- ``POST /console/session`` (form field ``token``; no script touches it): the token is compared
  in constant time with the edge's admin token (SHA-256 of both, ``hmac.compare_digest``); an
  API key is not an admin token and is refused like any wrong one. On success a random
  session id (256 bits) is set as a cookie — ``HttpOnly``, ``SameSite=Strict``, ``Path=/``,
  ``Max-Age`` the session's lifetime, and ``Secure`` with the ``__Host-`` prefix when the edge
  serves TLS — and only its SHA-256 is stored, in Redis with the same TTL, so sessions hold
  across edge replicas and restarts, and a Redis dump holds nothing that opens the console.
- Cross-site requests cannot use the session (``SameSite=Strict``) and state-changing POSTs
  must also come from this origin (``Origin`` checked when sent).
- Failed logins are limited per client IP (``login_failures_per_minute``), on top of the
  edge's per-IP request bucket.
- ``POST /console/logout`` deletes the session; open event streams notice at their next
  heartbeat.
- Redis down: the console is refused (503) — fail closed; the chat API is not affected.

Nothing here logs a token or a session id; log lines carry the session's hash prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from services.common.clock import Clock
from services.common.errors import MeridianError, RateLimited, Unavailable
from services.edge.guard import client_ip
from services.edge.redisconn import REDIS_FAILURES, RedisClient

SESSION_KEY_PREFIX = "meridian:console:session:"
_MAX_SESSION_ID_CHARS = 128


class NoSession(MeridianError):
    """No valid console session: 401."""

    http_status = 401
    openai_type = "authentication_error"
    default_code = "console_session_required"


@dataclass(frozen=True, slots=True)
class Session:
    digest: str  # hex SHA-256 of the session id
    expires_at: float  # unix seconds

    @property
    def tag(self) -> str:
        """What logs may show: the first 12 hex digits of the id's hash."""
        return self.digest[:12]


def cookie_name(tls: bool) -> str:
    """``__Host-`` demands Secure and Path=/ (the browser enforces both); plain HTTP cannot."""
    return "__Host-meridian_console" if tls else "meridian_console"


class LoginFailures:
    """Failed logins per client IP in a sliding minute (bounded: oldest IPs forgotten)."""

    def __init__(self, *, per_minute: int, clock: Clock, max_ips: int = 4096) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._max_ips = max_ips
        self._by_ip: dict[str, deque[float]] = {}

    def retry_after_s(self, ip: str) -> float:
        """0 when ``ip`` may try again now."""
        now = self._clock.monotonic()
        times = self._by_ip.get(ip)
        if not times:
            return 0.0
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) < self._per_minute:
            return 0.0
        return times[0] + 60 - now

    def failed(self, ip: str) -> None:
        if ip not in self._by_ip and len(self._by_ip) >= self._max_ips:
            self._by_ip.pop(next(iter(self._by_ip)))
        self._by_ip.setdefault(ip, deque()).append(self._clock.monotonic())


class ConsoleSessions:
    """Login, check and logout of console sessions (see the module docstring)."""

    def __init__(
        self,
        *,
        redis: RedisClient,
        admin_token_sha256: bytes,
        ttl_s: float,
        tls: bool,
        clock: Clock,
        login_failures_per_minute: int,
    ) -> None:
        self._redis = redis
        self._token_sha256 = admin_token_sha256
        self._ttl_s = ttl_s
        self.tls = tls
        self.cookie = cookie_name(tls)
        self._clock = clock
        self._failures = LoginFailures(per_minute=login_failures_per_minute, clock=clock)

    def token_ok(self, token: str) -> bool:
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(digest, self._token_sha256)

    async def login(self, request: web.Request, token: str) -> tuple[str, Session] | None:
        """A new session id and its session, or None for a wrong token (counted per IP)."""
        ip = client_ip(request)
        wait = self._failures.retry_after_s(ip)
        if wait > 0:
            raise RateLimited("Too many failed console logins; wait a minute.", retry_after_s=wait)
        if not self.token_ok(token):
            self._failures.failed(ip)
            return None
        sid = secrets.token_urlsafe(32)
        session = Session(_digest(sid), time.time() + self._ttl_s)
        value = json.dumps({"expires_at": session.expires_at})
        with _redis_errors():
            await self._redis.set(SESSION_KEY_PREFIX + session.digest, value, ex=int(self._ttl_s))
        return sid, session

    async def check(self, request: web.Request) -> Session:
        """The request's live session, or :class:`NoSession` (an ``Authorization`` header —
        an API key, even the admin token — is never a session)."""
        sid = request.cookies.get(self.cookie, "")
        if not sid or len(sid) > _MAX_SESSION_ID_CHARS:
            raise NoSession("Sign in to the console first.")
        return await self.lookup(_digest(sid))

    async def lookup(self, digest: str) -> Session:
        with _redis_errors():
            raw = await self._redis.get(SESSION_KEY_PREFIX + digest)
        if raw is None:
            raise NoSession("The console session has ended; sign in again.")
        try:
            expires_at = float(json.loads(raw)["expires_at"])
        except (ValueError, KeyError, TypeError):
            raise NoSession("The console session is not valid; sign in again.") from None
        if expires_at <= time.time():
            raise NoSession("The console session has ended; sign in again.")
        return Session(digest, expires_at)

    async def logout(self, request: web.Request) -> None:
        sid = request.cookies.get(self.cookie, "")
        if sid and len(sid) <= _MAX_SESSION_ID_CHARS:
            with _redis_errors():
                await self._redis.delete(SESSION_KEY_PREFIX + _digest(sid))

    def set_cookie(self, resp: web.StreamResponse, sid: str) -> None:
        resp.set_cookie(
            self.cookie,
            sid,
            max_age=int(self._ttl_s),
            path="/",
            httponly=True,
            secure=self.tls,
            samesite="Strict",
        )

    def clear_cookie(self, resp: web.StreamResponse) -> None:
        resp.set_cookie(
            self.cookie, "", max_age=0, path="/", httponly=True, secure=self.tls, samesite="Strict"
        )


@contextlib.contextmanager
def _redis_errors() -> Iterator[None]:
    """Redis unreachable: the console fails closed with a 503 (the chat API is unaffected)."""
    try:
        yield
    except REDIS_FAILURES:
        raise Unavailable(
            "The console cannot check sessions right now; try again shortly.", retry_after_s=2.0
        ) from None


def _digest(sid: str) -> str:
    # A cookie's bytes that are not UTF-8 arrive as lone surrogates: hash the bytes back.
    return hashlib.sha256(sid.encode("utf-8", "surrogateescape")).hexdigest()


def same_origin(request: web.Request) -> bool:
    """Whether a state-changing request comes from this origin.

    Browsers say where a request comes from in ``Sec-Fetch-Site`` (trusted: scripts cannot
    set it); without it, ``Origin`` must be this origin. A page with ``Referrer-Policy:
    no-referrer`` (ours) makes browsers send ``Origin: null``, hence the first check. A client
    that sends neither (curl) carries no ambient cookie unless told to, so it is let through.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return origin == f"{request.scheme}://{request.host}"
