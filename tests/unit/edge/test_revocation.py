"""Which requests in flight an invalidation re-checks, and what a check's verdict cuts
(services/edge/tenancy/revocation.py). The authenticator is a stand-in whose ``recheck``
answers what the test says; the lifecycle and its cut scopes are the real ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest

from services.edge.counters import EdgeCounters
from services.edge.guard import InFlight, Lifecycle
from services.edge.httperrors import Interrupted, KeyRevoked, TenantDisabled
from services.edge.tenancy.auth import Authenticator
from services.edge.tenancy.revocation import InFlightRevocation


class StandIn:
    """``recheck(digest)`` answers ``verdicts[digest]`` once ``release`` is set."""

    def __init__(self) -> None:
        self.on_change: Callable[[str, str], None] | None = None
        self.verdicts: dict[str, Interrupted | None] = {}
        self.asked: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        #: what ``expires_ms`` answers: the key's expiry as the last lookup read it
        self.expiry: dict[str, int] = {}

    def expires_ms(self, digest: str) -> int | None:
        return self.expiry.get(digest)

    async def recheck(self, digest: str) -> Interrupted | None:
        self.asked.append(digest)
        await self.release.wait()
        return self.verdicts.get(digest)


class Running:
    """Requests held in flight, each waiting inside its cut scope until cut (or the end)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle
        self.outcomes: dict[str, BaseException | None] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, *, digest: str, tenant: str) -> None:
        async def hold() -> None:
            try:
                async with self._lifecycle.request(trace_id=name) as flight:
                    flight.key_digest, flight.tenant_id = digest, tenant
                    async with flight.scope():
                        await asyncio.sleep(30)
            except Interrupted as err:
                self.outcomes[name] = err

        self._tasks.append(asyncio.create_task(hold()))

    def cut(self) -> set[str]:
        return set(self.outcomes)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def world() -> AsyncIterator[tuple[StandIn, Running, InFlightRevocation, EdgeCounters]]:
    auth, lifecycle, counters = StandIn(), Lifecycle(), EdgeCounters()
    revocation = InFlightRevocation(
        auth=cast(Authenticator, auth), lifecycle=lifecycle, counters=counters
    )
    running = Running(lifecycle)
    running.start("a1", digest="da", tenant="t1")
    running.start("a2", digest="da", tenant="t1")
    running.start("b", digest="db", tenant="t1")
    running.start("c", digest="dc", tenant="t2")
    running.start("anonymous", digest="", tenant="")  # not authenticated yet
    await asyncio.sleep(0.01)
    yield auth, running, revocation, counters
    await running.stop()
    await revocation.close()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_key_event_cuts_that_keys_requests_only(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, _, counters = world
    auth.verdicts["da"] = KeyRevoked("revoked")
    assert auth.on_change is not None
    auth.on_change("key", "da")
    await settle()
    assert auth.asked == ["da"]
    assert running.cut() == {"a1", "a2"}
    assert all(isinstance(e, KeyRevoked) for e in running.outcomes.values())
    assert counters.revoked_requests_cut == 2
    assert counters.auth_rechecks == 1


async def test_a_tenant_event_checks_each_of_its_keys_once(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, _, _ = world
    auth.verdicts.update(da=TenantDisabled("off"), db=TenantDisabled("off"))
    assert auth.on_change is not None
    auth.on_change("tenant", "t1")
    await settle()
    assert sorted(auth.asked) == ["da", "db"]
    assert running.cut() == {"a1", "a2", "b"}


async def test_missed_events_check_every_key_in_flight(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, _, _ = world
    auth.verdicts["dc"] = KeyRevoked("revoked")
    assert auth.on_change is not None
    auth.on_change("all", "")
    await settle()
    assert sorted(auth.asked) == ["da", "db", "dc"]  # never the unauthenticated one
    assert running.cut() == {"c"}


async def test_a_check_that_cannot_tell_cuts_nothing(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    """``recheck`` answers None both for a usable key and when Redis cannot be reached."""
    auth, running, _, counters = world
    assert auth.on_change is not None
    auth.on_change("key", "da")
    await settle()
    assert auth.asked == ["da"]
    assert running.cut() == set()
    assert counters.revoked_requests_cut == 0


async def test_an_event_during_a_check_checks_again_after_it(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    """The lookup in progress may have read Redis before the second change: it is not
    trusted for that one, and two events in a row do not make two lookups at once."""
    auth, running, _, _ = world
    auth.release.clear()
    assert auth.on_change is not None
    auth.on_change("key", "da")  # e.g. rotated
    await settle()
    auth.on_change("key", "da")  # then revoked, while the first lookup is out
    auth.on_change("key", "da")
    await settle()
    assert auth.asked == ["da"]
    auth.verdicts["da"] = KeyRevoked("revoked")
    auth.release.set()
    await settle()
    assert auth.asked == ["da", "da"]
    assert running.cut() == {"a1", "a2"}


async def test_a_failing_check_is_logged_and_the_next_event_checks_again(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, _, _ = world

    async def broken(digest: str) -> Interrupted | None:
        raise RuntimeError("boom")

    real = auth.recheck
    auth.recheck = broken  # type: ignore[method-assign]
    assert auth.on_change is not None
    auth.on_change("key", "da")
    await settle()
    auth.recheck = real  # type: ignore[method-assign]
    auth.verdicts["da"] = KeyRevoked("revoked")
    auth.on_change("key", "da")
    await settle()
    assert running.cut() == {"a1", "a2"}


async def test_a_cut_request_that_enters_a_new_scope_is_refused_at_once() -> None:
    lifecycle = Lifecycle()

    async def request() -> None:
        async with lifecycle.request() as flight:
            flight.key_digest = "da"
            cut = lifecycle.cut_where(lambda f: f.key_digest == "da", KeyRevoked("revoked"))
            assert (cut.streams, cut.requests) == (0, 1)
            with pytest.raises(KeyRevoked):
                async with flight.scope():
                    pass  # pragma: no cover
            await asyncio.sleep(1)

    with pytest.raises(KeyRevoked):  # the request's own outer scope ends it too
        await request()
    assert lifecycle.in_flight == 0


def test_in_flight_knows_nobody_until_authenticated() -> None:
    flight = InFlight()
    assert (flight.key_digest, flight.tenant_id, flight.cut) == ("", "", None)


def in_ms(seconds: float) -> int:
    """The epoch millisecond ``seconds`` from now (what a key's ``expires_ms`` holds)."""
    return int((time.time() + seconds) * 1000)


async def test_a_key_that_runs_out_is_checked_again_just_after_and_its_requests_end(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    """A rotation's grace period ending sends no event: the timer is the only check."""
    auth, running, revocation, counters = world
    auth.verdicts["da"] = KeyRevoked("expired")
    revocation.expires("da", in_ms(0.2))
    await asyncio.sleep(0.1)
    assert auth.asked == []  # not before it runs out
    await asyncio.sleep(0.4)
    assert auth.asked == ["da"]
    assert running.cut() == {"a1", "a2"}
    assert counters.revoked_requests_cut == 2


async def test_a_key_still_usable_at_its_timer_is_watched_until_its_new_expiry(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    """The timer's check reads the key's expiry as Redis has it now (moved later, say) and
    arms itself again for that."""
    auth, running, revocation, _ = world
    auth.expiry["db"] = in_ms(0.4)
    revocation.expires("db", in_ms(0.05))
    await asyncio.sleep(0.25)
    assert auth.asked == ["db"]
    assert running.cut() == set()
    auth.verdicts["db"] = KeyRevoked("expired")
    await asyncio.sleep(0.45)
    assert auth.asked == ["db", "db"]
    assert running.cut() == {"b"}


async def test_an_earlier_expiry_replaces_a_later_timer_and_a_later_one_does_not(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, revocation, _ = world
    auth.verdicts["dc"] = KeyRevoked("expired")
    revocation.expires("dc", in_ms(60))
    revocation.expires("dc", in_ms(0.1))
    revocation.expires("dc", in_ms(30))  # a request admitted under a later expiry
    await asyncio.sleep(0.4)
    assert auth.asked == ["dc"]
    assert running.cut() == {"c"}


async def test_a_timer_for_a_key_with_nothing_in_flight_checks_nothing(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, revocation, _ = world
    revocation.expires("gone", in_ms(0.05))
    await asyncio.sleep(0.25)
    assert auth.asked == []
    assert running.cut() == set()


async def test_closing_cancels_the_expiry_timers(
    world: tuple[StandIn, Running, InFlightRevocation, EdgeCounters],
) -> None:
    auth, running, revocation, _ = world
    auth.verdicts["da"] = KeyRevoked("expired")
    revocation.expires("da", in_ms(0.1))
    await revocation.close()
    await asyncio.sleep(0.3)
    assert auth.asked == []
    assert running.cut() == set()
