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
A key whose rotation grace runs out has no event at that moment: its streams end at the next
check, or at their own end.

Cost: nothing per request or token (two attribute writes at authentication); per event, one
pass over the requests in flight and one Redis lookup per distinct key concerned.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry.trace import Tracer

from services.common.logs import event
from services.edge.counters import EdgeCounters
from services.edge.guard import InFlight, Lifecycle
from services.edge.tenancy.auth import Authenticator

log = logging.getLogger("meridian.edge.auth")

#: Trace ids a cut's log line lists at most (the count is always whole).
LOGGED_TRACES = 16


class InFlightRevocation:
    """Follows the authenticator's invalidations and cuts what may no longer run."""

    def __init__(
        self,
        *,
        auth: Authenticator,
        lifecycle: Lifecycle,
        counters: EdgeCounters,
        tracer: Tracer | None = None,
    ) -> None:
        self._auth = auth
        self._lifecycle = lifecycle
        self._counters = counters
        self._tracer = tracer
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
        """Cancel the checks in progress (the edge is stopping)."""
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
