"""Ending the requests already running under a key that was revoked, or a tenant disabled.

Authentication happens once, when a request arrives; a streaming request can then run for
minutes. Without this, revoking a leaked key stopped new requests (on every replica at once:
the invalidation event) while the streams it had opened went on to their end. Now each
invalidation the edge hears (:meth:`~services.edge.tenancy.auth.Authenticator.on_change`) is
matched against the requests in flight (:meth:`~services.edge.guard.Lifecycle.live`: each
knows its key's digest and tenant once authenticated); for each key concerned, the key is
looked up again in Redis, and if it may no longer be used, its requests are cut the way the
drain deadline cuts them: a live SSE stream gets one last OpenAI-style error event
(``invalid_api_key`` / ``tenant_disabled``) and ``[DONE]``, a request with no response yet gets
the 401/403; the worker call is cancelled and the usage settled with the tokens used.

What is re-checked: a key event (revoke, rotation, expiry change) checks that key; a tenant
event checks its keys in flight; a re-subscription (events may have been missed while the edge
was not listening) checks every key in flight. A check that cannot reach Redis leaves the
requests running — a running request is not ended on a guess; the next event checks again.
A key that stops working at a set time (a rotation's grace period, or an expiry given at
creation) has no event at that moment: a request admitted under it arms one timer per key
(:meth:`InFlightRevocation.expires`) that checks the key again just after that time, so its
streams end with the grace period, not at their own end. A check that finds the key still
usable arms the timer for its expiry as Redis now has it (a later rotation can move it).

Cost: nothing per request or token (two attribute writes at authentication, a dict look-up
for a key that expires); per event, one pass over the requests in flight and one Redis lookup
per distinct key concerned.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry.trace import Tracer

from services.common.clock import Clock, SystemClock
from services.common.logs import event
from services.edge.counters import EdgeCounters
from services.edge.guard import InFlight, Lifecycle
from services.edge.tenancy.auth import Authenticator

log = logging.getLogger("meridian.edge.auth")

#: Trace ids a cut's log line lists at most (the count is always whole).
LOGGED_TRACES = 16
#: How long after a key's expiry its timer checks it: the key must read as expired by then
#: (``KeyRecord.usable`` compares milliseconds), and Redis's clock is not the edge's.
EXPIRY_SLACK_S = 0.05


class InFlightRevocation:
    """Follows the authenticator's invalidations and cuts what may no longer run."""

    def __init__(
        self,
        *,
        auth: Authenticator,
        lifecycle: Lifecycle,
        counters: EdgeCounters,
        tracer: Tracer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._auth = auth
        self._lifecycle = lifecycle
        self._counters = counters
        self._tracer = tracer
        self._clock = clock or SystemClock()
        #: Keys with requests admitted that stop working at a set time: that time (epoch ms)
        #: and the timer that checks them just after it. One per key, the earliest.
        self._expiring: dict[str, tuple[int, asyncio.TimerHandle]] = {}
        #: Keys being checked, and whether another event for one came meanwhile (check again:
        #: the lookup in progress may have read Redis before that change).
        self._checking: dict[str, bool] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        auth.on_change = self.changed

    def changed(self, kind: str, value: str) -> None:
        """One invalidation (``key``/digest, ``tenant``/id, ``all``): check the keys of the
        requests in flight that it concerns."""
        digests = {f.key_digest for f in self._lifecycle.live() if _concerns(f, kind, value)}
        digests.discard("")
        for digest in digests:
            if digest in self._checking:
                self._checking[digest] = True
                continue
            self._checking[digest] = False
            task = asyncio.get_running_loop().create_task(self._check(digest))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def expires(self, digest: str, expires_ms: int) -> None:
        """A request was admitted under a key that stops working at ``expires_ms`` (epoch
        ms): check that key again just after then. A timer already set for the key at that
        time or earlier stands (its check sets the next one if the key is still usable)."""
        armed = self._expiring.get(digest)
        if armed is not None:
            if armed[0] <= expires_ms:
                return
            armed[1].cancel()
        delay = max(0.0, expires_ms / 1000.0 - self._clock.time()) + EXPIRY_SLACK_S
        handle = asyncio.get_running_loop().call_later(delay, self._expired, digest)
        self._expiring[digest] = (expires_ms, handle)

    def _expired(self, digest: str) -> None:
        self._expiring.pop(digest, None)
        self.changed("key", digest)

    async def _check(self, digest: str) -> None:
        try:
            while True:
                await self._check_once(digest)
                if not self._checking.get(digest):
                    return
                self._checking[digest] = False  # an event came during the lookup: again
        except Exception as err:  # noqa: BLE001 - a failed check must not end the listener
            event(log, "auth.recheck_failed", level=logging.WARNING, error=type(err).__name__)
        finally:
            self._checking.pop(digest, None)

    async def _check_once(self, digest: str) -> None:
        self._counters.auth_rechecks += 1
        if self._tracer is None:
            why = await self._auth.recheck(digest)
        else:
            with self._tracer.start_as_current_span("edge.auth.recheck") as span:
                why = await self._auth.recheck(digest)
                span.set_attribute("meridian.auth.cut", why is not None)
        if why is None:
            expires_ms = self._auth.expires_ms(digest)
            if expires_ms is not None and any(
                f.key_digest == digest for f in self._lifecycle.live()
            ):
                self.expires(digest, expires_ms)
            return
        concerned = [f for f in self._lifecycle.live() if f.key_digest == digest]
        cut = self._lifecycle.cut_where(lambda f: f.key_digest == digest, why)
        if not cut.streams and not cut.requests:
            return
        self._counters.revoked_streams_cut += cut.streams
        self._counters.revoked_requests_cut += cut.requests
        event(
            log,
            "auth.inflight_cut",
            level=logging.WARNING,
            code=why.code,
            tenant=concerned[0].tenant_id if concerned else "",
            streams=cut.streams,
            requests=cut.requests,
            trace_ids=[f.trace_id for f in concerned[:LOGGED_TRACES] if f.trace_id],
        )

    async def close(self) -> None:
        """Cancel the checks in progress and the expiry timers (the edge is stopping)."""
        for _, handle in self._expiring.values():
            handle.cancel()
        self._expiring.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _concerns(flight: InFlight, kind: str, value: str) -> bool:
    if kind == "key":
        return flight.key_digest == value
    if kind == "tenant":
        return flight.tenant_id == value
    return True  # "all": events may have been missed
