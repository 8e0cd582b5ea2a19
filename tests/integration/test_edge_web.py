"""The edge's pages over real HTTP: static files served properly, console sessions, the
console's event stream from the router's WatchFleet, and the per-request explanation.

The three-region stack of conftest.py (real workers, delay proxies, router, edge, Redis)."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from services.edge.web.assets import CSP
from services.edge.web.config import WebConfig
from services.worker.sim import SimEngine
from tests.integration.conftest import MODEL, Stack, sim_config
from tests.support.builders import TEST_ADMIN_TOKEN, edge_config
from tests.support.inproc import start_edge, start_router, start_worker, stop_all
from tests.support.rawhttp import exchange

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def browserlike() -> aiohttp.ClientSession:
    """A client that keeps cookies for 127.0.0.1 as a browser does (aiohttp's jar refuses
    cookies from IP addresses unless told)."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def chat(stack: Stack, http: aiohttp.ClientSession, key: str | None = None) -> str:
    """One small completion; its x-request-id."""
    async with http.post(
        f"{stack.edge.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {key or stack.key}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["x-request-id"]


async def sign_in(
    stack: Stack | str, http: aiohttp.ClientSession, token: str = TEST_ADMIN_TOKEN
) -> aiohttp.ClientResponse:
    url = stack if isinstance(stack, str) else stack.edge.url
    resp = await http.post(
        f"{url}/console/session",
        data=f"token={token}",
        headers=FORM,
        allow_redirects=False,
    )
    await resp.read()
    return resp


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    name = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name:
            yield name, json.loads(line[6:])
            name = ""


# --- static content -------------------------------------------------------------------------


async def test_pages_carry_a_strict_csp_an_etag_and_revalidate(stack: Stack) -> None:
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        resp = await http.get(f"{stack.edge.url}/", headers={"Accept-Encoding": "identity"})
        html = await resp.text()
        assert resp.status == 200
        csp = resp.headers["Content-Security-Policy"]
        assert csp == CSP
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert "require-trusted-types-for 'script'" in csp
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert "<script>" not in html
        assert " on" not in re.sub(r"\s+", " ", html).lower().split("<body")[0]
        etag = resp.headers["ETag"]
        again = await http.get(
            f"{stack.edge.url}/", headers={"If-None-Match": etag, "Accept-Encoding": "identity"}
        )
        assert again.status == 304
        assert not await again.read()
        # Every asset the page names has the current version in its URL.
        refs = re.findall(r'"/static/([^"?]+)\?v=([0-9a-f]{16})"', html)
        assert {r[0] for r in refs} >= {"app.css", "chat.js", "markdown.js", "vendor/purify.min.js"}


async def test_assets_are_compressed_and_cached_by_version(stack: Stack) -> None:
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        store = stack.edge.server.web.assets
        url = f"{stack.edge.url}{store.url('chat.js')}"
        plain = await http.get(url, headers={"Accept-Encoding": "identity"})
        body = await plain.read()
        assert plain.headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert plain.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert "Content-Encoding" not in plain.headers
        packed = await http.get(url, headers={"Accept-Encoding": "gzip, br"})
        assert packed.headers["Content-Encoding"] == "gzip"
        assert packed.headers["Vary"] == "Accept-Encoding"
        assert packed.headers["ETag"] != plain.headers["ETag"]
        assert gzip.decompress(await packed.read()) == body
        stale = await http.get(f"{stack.edge.url}/static/chat.js?v=0000000000000000")
        assert stale.headers["Cache-Control"] == "no-cache"
        await stale.read()
        head = await http.head(url)
        assert head.status == 200
        assert head.headers["ETag"]
        for path in ("/static/nope.js", "/static/index.html", "/static/../server.py"):
            missing = await http.get(f"{stack.edge.url}{path}")
            assert missing.status == 404, path
            assert (await missing.json())["error"]["type"] == "invalid_request_error"


# --- console sessions -----------------------------------------------------------------------


async def test_the_console_refuses_requests_without_a_session(stack: Stack) -> None:
    async with browserlike() as http:
        page = await http.get(f"{stack.edge.url}/console")
        assert page.status == 401
        assert "Sign in" in await page.text()
        assert page.headers["Cache-Control"] == "private, no-store"
        for auth in (
            {},
            {"Authorization": f"Bearer {stack.key}"},
            {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
        ):
            events = await http.get(f"{stack.edge.url}/console/events", headers=auth)
            assert events.status == 401
            assert (await events.json())["error"]["code"] == "console_session_required"


async def test_an_api_key_is_not_an_admin_token(stack: Stack) -> None:
    async with browserlike() as http:
        resp = await sign_in(stack, http, token=stack.key)
        assert resp.status == 303
        assert resp.headers["Location"] == "/console?denied=1"
        assert not resp.cookies
        assert (await http.get(f"{stack.edge.url}/console/events")).status == 401


async def test_signing_in_sets_an_httponly_strict_cookie_and_signing_out_ends_it(
    stack: Stack,
) -> None:
    async with browserlike() as http:
        resp = await sign_in(stack, http)
        assert resp.status == 303
        assert resp.headers["Location"] == "/console"
        cookie = resp.headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP here; test_edge_tls-like stacks set it
        assert TEST_ADMIN_TOKEN not in cookie
        page = await http.get(f"{stack.edge.url}/console")
        assert page.status == 200
        assert "fleet console" in await page.text()
        # Only the session id's hash is stored.
        sid = resp.cookies["meridian_console"].value
        keys = [k.decode() async for k in stack.edge.redis.scan_iter("meridian:console:*")]
        assert keys
        assert all(sid not in k for k in keys)
        cross = await http.post(
            f"{stack.edge.url}/console/logout",
            headers={"Sec-Fetch-Site": "cross-site"},
            allow_redirects=False,
        )
        assert cross.status == 400  # a cross-site form cannot sign anyone out
        out = await http.post(f"{stack.edge.url}/console/logout", allow_redirects=False)
        assert out.status == 303
        http.cookie_jar.update_cookies({"meridian_console": sid})  # replaying the old cookie
        assert (await http.get(f"{stack.edge.url}/console")).status == 401


async def test_a_cross_site_sign_in_is_refused(stack: Stack) -> None:
    async with browserlike() as http:
        resp = await http.post(
            f"{stack.edge.url}/console/session",
            data=f"token={TEST_ADMIN_TOKEN}",
            headers={**FORM, "Origin": "https://evil.example"},
            allow_redirects=False,
        )
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "Origin"


async def test_wrong_tokens_are_limited_per_address(stack: Stack) -> None:
    async with browserlike() as http:
        for _ in range(10):
            assert (await sign_in(stack, http, token="x" * 32)).status == 303
        limited = await sign_in(stack, http, token="x" * 32)
        assert limited.status == 429
        assert int(limited.headers["Retry-After"]) >= 1
        # Even the right token waits: guessing is what the limit is for.
        assert (await sign_in(stack, http)).status == 429


# --- the event stream -----------------------------------------------------------------------


async def test_the_event_stream_sends_the_view_and_live_decisions(stack: Stack) -> None:
    async with browserlike() as http:
        assert (await sign_in(stack, http)).status == 303
        events = await http.get(f"{stack.edge.url}/console/events")
        assert events.status == 200
        assert events.headers["Content-Type"].startswith("text/event-stream")
        hub = stack.edge.server.web.hub
        assert hub.open_streams == 1
        seen: dict[str, Any] = {}

        async def read() -> None:
            async for name, data in sse_events(events):
                seen.setdefault(name, data)
                if "view" in seen and "decisions" in seen:
                    return

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.3)
        for _ in range(3):
            await chat(stack, http)
        await asyncio.wait_for(reader, 10)
        view = seen["view"]
        assert {w["id"] for w in view["workers"]} == {"kr-1", "jp-1", "us-1"}
        kr = next(w for w in view["workers"] if w["id"] == "kr-1")
        assert kr["state"] == "ready"
        assert kr["rtt_ms"] > 0
        assert kr["max_running"] > 0
        assert {"queue" if k == "waiting" else k for k in kr} >= {
            "queue",
            "kv_cache",
            "in_flight",
            "tokens_per_s",
            "gpu",
            "loss",
        }
        decision = seen["decisions"][0]
        assert decision["region"] in {"kr", "jp", "us"}
        assert decision["signal"]
        assert decision["worker"].startswith(decision["region"])
        events.close()
        await asyncio.sleep(0.3)
        assert hub.open_streams == 0
    # The router's watcher slot is given back: the upstream stream stops with the last page.
    router_feed = stack.router.server.service.feed
    for _ in range(50):
        if router_feed.watchers == 0:
            break
        await asyncio.sleep(0.05)
    assert router_feed.watchers == 0


async def test_streams_are_bounded_per_session(stack: Stack) -> None:
    limit = stack.edge.server.web.config.max_console_streams_per_session
    async with browserlike() as http:
        assert (await sign_in(stack, http)).status == 303
        opened = [await http.get(f"{stack.edge.url}/console/events") for _ in range(limit)]
        assert all(r.status == 200 for r in opened)
        refused = await http.get(f"{stack.edge.url}/console/events")
        assert refused.status == 503
        assert refused.headers["Retry-After"]
        for r in opened:
            r.close()


async def test_draining_ends_console_streams(redis_url: str) -> None:
    from tests.integration.conftest import start_stack, stop_stack

    s = await start_stack(redis_url)
    try:
        async with browserlike() as http:
            assert (await sign_in(s, http)).status == 303
            events = await http.get(f"{s.edge.url}/console/events")
            s.edge.server.begin_drain()
            body = await asyncio.wait_for(events.read(), 5)  # ends, does not hold the drain
            assert body.startswith(b"retry:")
    finally:
        await stop_stack(s)


async def test_signing_out_ends_open_streams_at_the_next_check(redis_url: str) -> None:
    worker = await start_worker(SimEngine(sim_config()), worker_id="kr-1", region="kr")
    router = await start_router([worker.address])
    await router.wait_healthy(1)
    edge = await start_edge(
        redis_url=redis_url,
        router_address=router.address,
        config=edge_config(web=WebConfig(heartbeat_s=0.2)),
    )
    try:
        async with browserlike() as http:
            assert (await sign_in(edge.url, http)).status == 303
            events = await http.get(f"{edge.url}/console/events")
            await http.post(f"{edge.url}/console/logout", allow_redirects=False)
            body = await asyncio.wait_for(events.read(), 5)
            assert body.endswith(b'event: session\ndata: {"ended":true}\n\n')
    finally:
        await stop_all(edge, router, worker)


# --- the explanation ------------------------------------------------------------------------


async def test_a_request_explains_its_routing(stack: Stack) -> None:
    async with browserlike() as http:
        request_id = await chat(stack, http)
        url = f"{stack.edge.url}/v1/explanations/{request_id}"
        resp = await http.get(url, headers={"Authorization": f"Bearer {stack.key}"})
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["request_id"] == request_id
        (decision,) = body["decisions"]
        assert decision["signal"]
        assert decision["explanation"]
        winner = decision["candidates"][0]
        signals = {c["signal"] for c in winner["contributions"]}
        assert {"latency", "queue"} <= signals
        assert all(c["detail"] is not None for c in winner["contributions"])
        assert len(decision["candidates"]) == 3  # the runners-up too


async def test_an_explanation_belongs_to_the_tenant_that_made_the_request(stack: Stack) -> None:
    other = await stack.edge.new_key("someone-else")
    async with browserlike() as http:
        request_id = await chat(stack, http)
        url = f"{stack.edge.url}/v1/explanations/{request_id}"
        theirs = await http.get(url, headers={"Authorization": f"Bearer {other}"})
        assert theirs.status == 404
        assert (await theirs.json())["error"]["param"] == "request_id"
        assert (await http.get(url)).status == 401
        bad = await http.get(
            f"{stack.edge.url}/v1/explanations/../../admin",
            headers={"Authorization": f"Bearer {stack.key}"},
        )
        assert bad.status in (400, 404)
        malformed = await http.get(
            f"{stack.edge.url}/v1/explanations/not-an-id",
            headers={"Authorization": f"Bearer {stack.key}"},
        )
        assert malformed.status == 400
        assert (await malformed.json())["error"]["param"] == "request_id"


async def test_a_sign_in_form_with_extra_fields_is_denied_not_a_500(stack: Stack) -> None:
    async with browserlike() as http:
        resp = await http.post(
            f"{stack.edge.url}/console/session",
            data=f"token={TEST_ADMIN_TOKEN}&a=1&b=2&c=3&d=4&e=5",
            headers=FORM,
            allow_redirects=False,
        )
        assert resp.status == 303
        assert resp.headers["Location"] == "/console?denied=1"


async def test_a_console_cookie_that_is_not_utf8_is_no_session_not_a_500(stack: Stack) -> None:
    for path in (b"/console", b"/console/events"):
        answer = await exchange(
            stack.edge.url,
            b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nCookie: meridian_console=\xff\xfe\xc3\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert answer.status == 401, answer.head


async def test_an_explanation_id_with_a_trailing_newline_is_400(stack: Stack) -> None:
    async with browserlike() as http:
        request_id = await chat(stack, http)
        resp = await http.get(
            f"{stack.edge.url}/v1/explanations/{request_id}%0A",
            headers={"Authorization": f"Bearer {stack.key}"},
        )
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "request_id"
