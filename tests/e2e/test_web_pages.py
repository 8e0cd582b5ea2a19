"""The chat page and the fleet console in a real browser, on ``make run``.

Headless Chromium (Debian's ``chromium``, installed by .ci/run) driven by Playwright with the
system browser as its executable (Playwright downloads no browser here). The stack is the one
a user starts (``make run``, EDGE_PORT=0, a private state folder); nothing is mocked, except
where a test says so: the HTML-injection test plays a malicious model by answering the page's
completion request itself (``page.route``), because no engine here writes such text.

Screenshots go to ``build/artifacts/browser/`` (``MERIDIAN_ARTIFACTS`` moves them);
docs/img/ holds two of them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from meridian.v1 import worker_pb2, worker_pb2_grpc
from tests.support.stackproc import StackProcess, start_stack_process

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("MERIDIAN_ARTIFACTS", REPO / "build/artifacts/browser"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackProcess]:
    try:
        running = start_stack_process(["make", "-s", "run"], tmp_path_factory.mktemp("state"))
    except RuntimeError as err:
        pytest.fail(str(err))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    assert errors == [], f"script errors on the page: {errors}"


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def open_chat(page: Page, stack: StackProcess, key: str | None = None) -> None:
    page.goto(stack.info["edge_url"] + "/")
    page.fill("#api-key", key or stack.key)
    page.click("#key-form button[type=submit]")


def running_on_workers(stack: StackProcess) -> dict[str, int]:
    """Each worker's running count, as its load reports tell the router."""
    url = stack.info["router_debug_url"] + "/debug/view"
    with urllib.request.urlopen(url, timeout=5) as resp:
        view = json.load(resp)
    return {w["worker_id"]: w["load"]["running"] for w in view["workers"]}


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def long_generation(route: Any) -> None:
    """Ask the real stack for a long reply (the page sends no max_tokens): the request goes
    through unchanged otherwise."""
    body = json.loads(route.request.post_data or "{}")
    body.update(max_tokens=4000, ignore_eos=True)
    route.continue_(post_data=json.dumps(body))


# --- chat ---------------------------------------------------------------------------------


def test_a_reply_streams_in_and_shows_where_and_how_fast(page: Page, stack: StackProcess) -> None:
    open_chat(page, stack)
    page.wait_for_selector("#model:enabled")
    # Record the reply's text length each time the page re-renders it while it streams.
    page.evaluate(
        """() => {
          window.__lengths = [];
          new MutationObserver(() => {
            const b = document.querySelector('.msg.assistant.streaming .bubble');
            if (b) window.__lengths.push(b.textContent.length);
          }).observe(document.getElementById('messages'),
                     {subtree: true, childList: true, characterData: true});
        }"""
    )
    page.route("**/v1/chat/completions", lambda r: _bounded(r, 160))
    page.fill("#prompt", "Where am I served from?")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming) [data-meta=ttft] dd", timeout=30_000)
    lengths = [n for n in page.evaluate("window.__lengths") if n > 0]
    assert len(set(lengths)) >= 2, f"the reply did not arrive in pieces: {lengths}"
    meta = {
        k: page.inner_text(f".msg.assistant [data-meta={k}] dd")
        for k in ("region", "worker", "ttft", "tps", "attempts", "tokens")
    }
    assert meta["region"] in {"kr", "jp", "us"}
    assert meta["worker"].startswith(meta["region"] + "-")
    assert meta["ttft"].endswith(" ms")
    assert float(meta["ttft"].split()[0]) > 0
    assert float(meta["tps"]) > 0
    assert meta["attempts"] == "1"
    prompt_tokens, completion_tokens = (int(n) for n in meta["tokens"].split(" / "))
    assert prompt_tokens > 0
    assert completion_tokens == 160
    page.click(".msg.assistant .why-button")
    page.wait_for_selector(".why table")
    why = page.inner_text(".why")
    assert "Deciding signal" in why
    assert meta["worker"] in why
    assert page.locator(".why .winner td").first.inner_text() == meta["worker"]
    shot(page, "chat")


def _bounded(route: Any, tokens: int) -> None:
    body = json.loads(route.request.post_data or "{}")
    body.update(max_tokens=tokens, ignore_eos=True)
    route.continue_(post_data=json.dumps(body))


def test_stop_cancels_the_generation_on_the_worker(page: Page, stack: StackProcess) -> None:
    open_chat(page, stack)
    page.wait_for_selector("#model:enabled")
    page.route("**/v1/chat/completions", long_generation)
    page.fill("#prompt", "Tell me a very long story.")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant.streaming .bubble p", timeout=30_000)
    wait_until(lambda: sum(running_on_workers(stack).values()) >= 1, 10, "a running generation")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .note:text('Stopped.')")
    wait_until(
        lambda: sum(running_on_workers(stack).values()) == 0, 5, "every worker's running count 0"
    )
    assert page.is_visible(".msg.assistant .regenerate")


def test_a_wrong_key_shows_the_401_message(page: Page, stack: StackProcess) -> None:
    open_chat(page, stack, key="mk-" + "A" * 43)
    page.wait_for_selector("#error:not([hidden])")
    text = page.inner_text("#error")
    assert "not accepted (401)" in text
    assert "Check the key" in text
    assert page.is_disabled("#model")
    assert page.evaluate("sessionStorage.getItem('meridian.apiKey')") is None
    shot(page, "chat-401")


def test_the_chat_page_reads_on_a_phone_in_light_and_dark(
    browser: Browser, stack: StackProcess
) -> None:
    for scheme in ("light", "dark"):
        ctx = browser.new_context(
            viewport={"width": 390, "height": 844}, color_scheme=scheme, is_mobile=True
        )
        try:
            page = ctx.new_page()
            open_chat(page, stack)
            page.wait_for_selector("#model:enabled")
            page.fill("#prompt", "hello from a phone")
            page.keyboard.press("Enter")
            page.wait_for_selector(".msg.assistant:not(.streaming) [data-meta=ttft] dd")
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{scheme}: the page is {overflow}px wider than the phone"
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            r, g, b = (int(v) for v in background.strip("rgba()").split(",")[:3])
            assert (r + g + b < 150) is (scheme == "dark"), (scheme, background)
            shot(page, f"chat-phone-{scheme}")
        finally:
            ctx.close()


def test_the_page_works_from_the_keyboard(page: Page, stack: StackProcess) -> None:
    page.goto(stack.info["edge_url"] + "/")
    page.keyboard.press("Tab")  # the skip link first
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Fleet console"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "api-key"
    page.keyboard.type(stack.key)
    page.keyboard.press("Enter")
    page.wait_for_selector("#model:enabled")
    page.focus("#prompt")
    page.keyboard.type("typed, not clicked")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming) .why-button")
    page.focus(".why-button")
    page.keyboard.press("Enter")
    page.wait_for_selector(".why table")


def test_a_refused_request_names_the_field(page: Page, stack: StackProcess) -> None:
    def bad_top_p(route: Any) -> None:
        body = json.loads(route.request.post_data or "{}")
        body["top_p"] = 3  # the page never sends this: the edge's 400 is what is shown
        route.continue_(post_data=json.dumps(body))

    open_chat(page, stack)
    page.wait_for_selector("#model:enabled")
    page.route("**/v1/chat/completions", bad_top_p)
    page.fill("#prompt", "hi")
    page.keyboard.press("Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "The request was refused (field: top_p)." in page.inner_text("#error")


def limited_key(stack: StackProcess) -> str:
    """A key of a tenant allowed one request a minute, made through the admin API."""
    admin = stack.info["admin_url"]
    auth = {"Authorization": f"Bearer {admin_token(stack)}", "Content-Type": "application/json"}
    tenant = json.dumps({"tenant_id": "one-a-minute", "limits": {"rpm": 1}}).encode()
    status, _, _ = _http(f"{admin}/admin/tenants", headers=auth, data=tenant)
    assert status in (201, 409)
    status, _, body = _http(
        f"{admin}/admin/tenants/one-a-minute/keys", headers=auth, data=b'{"name": "e2e"}'
    )
    assert status == 201
    return str(json.loads(body)["key"])


def test_a_rate_limited_reply_says_when_to_try_again(page: Page, stack: StackProcess) -> None:
    open_chat(page, stack, key=limited_key(stack))
    page.wait_for_selector("#model:enabled")
    page.route("**/v1/chat/completions", lambda r: _bounded(r, 4))
    for text in ("first", "second"):
        page.fill("#prompt", text)
        page.keyboard.press("Enter")
        page.wait_for_selector("#send:enabled")
    page.wait_for_selector("#error:not([hidden])")
    message = page.inner_text("#error")
    assert "rate limit reached (429)" in message
    assert "Try again in" in message
    assert page.locator("#error .countdown").inner_text().endswith(" s)")
    shot(page, "chat-429")


MALICIOUS = (
    "Here you go: <script>window.__pwned = 'script'</script>\n\n"
    '<img src="x" onerror="window.__pwned = \'img\'">\n\n'
    "[a link](javascript:window.__pwned='link') and **bold** `code`"
)


def test_model_output_with_html_renders_as_text(page: Page, stack: StackProcess) -> None:
    """A malicious model (played by page.route: no engine here writes such text)."""

    def fake_model(route: Any) -> None:
        chunks = [MALICIOUS[i : i + 17] for i in range(0, len(MALICIOUS), 17)]
        body = "".join(
            "data: "
            + json.dumps({"choices": [{"index": 0, "delta": {"content": c}}], "object": "chunk"})
            + "\n\n"
            for c in chunks
        )
        route.fulfill(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "x-request-id": "chatcmpl-" + "0" * 32,
                "x-meridian-region": "kr",
                "x-meridian-worker": "kr-1",
            },
            body=body + "data: [DONE]\n\n",
        )

    open_chat(page, stack)
    page.wait_for_selector("#model:enabled")
    page.route("**/v1/chat/completions", fake_model)
    page.fill("#prompt", "say something nasty")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming) .bubble strong")
    bubble = page.locator(".msg.assistant .bubble")
    text = bubble.inner_text()
    assert "<script>window.__pwned = 'script'</script>" in text
    assert '<img src="x" onerror=' in text
    assert bubble.locator("script, img, iframe, [onerror]").count() == 0
    links = bubble.locator("a")
    assert links.count() == 1
    assert links.inner_text() == "a link"
    assert links.get_attribute("href") is None
    links.click()
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert bubble.locator("code").inner_text() == "code"
    shot(page, "chat-untrusted-output")


# --- console --------------------------------------------------------------------------------


def _http(
    url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read(2048)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_the_console_needs_a_session_and_an_api_key_is_not_one(stack: StackProcess) -> None:
    edge = stack.info["edge_url"]
    bearer = {"Authorization": f"Bearer {stack.key}"}
    for path in ("/console", "/console/events"):
        assert _http(edge + path)[0] == 401
        assert _http(edge + path, headers=bearer)[0] == 401
    status, headers, _ = _http(
        edge + "/console/session",
        data=urllib.parse.urlencode({"token": stack.key}).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 303
    assert headers["Location"] == "/console?denied=1"
    assert "Set-Cookie" not in headers


def admin_token(stack: StackProcess) -> str:
    return (stack.state / "run" / "secrets" / "admin-token").read_text().strip()


def sign_in(page: Page, stack: StackProcess) -> None:
    page.goto(stack.info["edge_url"] + "/console")
    page.fill("#token", admin_token(stack))
    page.click("form button[type=submit]")
    page.wait_for_selector("#workers tr[data-worker]")


def test_the_session_cookie_is_httponly_and_strict(
    context: BrowserContext, page: Page, stack: StackProcess
) -> None:
    sign_in(page, stack)
    cookies = [c for c in context.cookies() if c["name"].endswith("meridian_console")]
    assert len(cookies) == 1
    assert cookies[0]["httpOnly"] is True
    assert cookies[0]["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # no token, no session id for scripts


class Background:
    """Traffic for the console to show, run on an event loop in a thread: chat requests
    through the edge, and (``flood``) long generations fed straight to a region's workers —
    traffic from other sites that this router never routed (bench/routing_quality's
    hotspot)."""

    def __init__(self, stack: StackProcess) -> None:
        self.stack = stack
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tasks: list[concurrent.futures.Future[Any]] = []

    def run(self, coro: Any) -> None:
        self.tasks.append(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def chat_traffic(self, per_s: float) -> None:
        import aiohttp

        url = self.stack.info["edge_url"] + "/v1/chat/completions"
        body = {
            "model": self.stack.info["model"],
            "messages": [{"role": "user", "content": "map me"}],
            "max_tokens": 4,
        }
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.stack.key}"}
        ) as http:
            pending: set[asyncio.Task[Any]] = set()
            try:
                while True:
                    pending.add(asyncio.create_task(self._one(http, url, body)))
                    pending = {t for t in pending if not t.done()}
                    await asyncio.sleep(1 / per_s)
            finally:
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    @staticmethod
    async def _one(http: Any, url: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            async with http.post(url, json=body) as resp:
                await resp.read()

    async def flood(self, region: str, per_worker: int) -> None:
        channels = []
        streams = []
        try:
            for name, w in self.stack.info["workers"].items():
                if w["region"] != region:
                    continue
                channel = grpc.aio.insecure_channel(w["direct"])
                channels.append(channel)
                stub = worker_pb2_grpc.WorkerStub(channel)
                for i in range(per_worker):
                    req = worker_pb2.GenerateRequest(
                        request_id=f"flood-{name}-{i}", model=self.stack.info["model"]
                    )
                    req.messages.add(role="user", content="background traffic from elsewhere")
                    req.sampling.max_tokens = 4000
                    req.sampling.ignore_eos = True
                    streams.append(asyncio.create_task(self._drain_slowly(stub, req)))
            await asyncio.gather(*streams)
        finally:
            for s in streams:
                s.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
            for c in channels:
                await c.close()

    @staticmethod
    async def _drain_slowly(stub: worker_pb2_grpc.WorkerStub, req: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for _ in stub.Generate(req):
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        time.sleep(0.5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def share(page: Page, region: str) -> float:
    value = page.get_attribute(f"#share li[data-region={region}]", "data-share")
    return float(value or 0)


def test_flooding_the_near_region_saturates_it_on_the_map_and_moves_decisions(
    page: Page, stack: StackProcess
) -> None:
    sign_in(page, stack)
    background = Background(stack)
    try:
        background.run(background.chat_traffic(per_s=6))
        page.wait_for_selector("#arrows path[data-region]", timeout=10_000)
        wait_until(lambda: share(page, "kr") > 0.6, 15, "decisions to go mostly to kr")
        assert page.get_attribute("#regions circle[data-region=kr]", "data-state") == "ok"
        background.run(background.flood("kr", per_worker=64))
        started = time.monotonic()
        page.wait_for_selector(
            "#regions circle[data-region=kr][data-state=saturated]", timeout=10_000
        )
        wait_until(lambda: share(page, "kr") < 0.2, 10, "decisions to leave kr")
        moved_after_s = time.monotonic() - started
        assert share(page, "jp") + share(page, "us") > 0.8
        arrows = page.eval_on_selector_all(
            "#arrows path[data-region]", "ps => ps.map(p => p.dataset.region)"
        )
        assert arrows
        assert arrows.count("kr") <= len(arrows) // 5, arrows
        saturated = page.eval_on_selector_all(
            "#workers tr[data-saturated=true]", "rs => rs.map(r => r.dataset.worker)"
        )
        assert set(saturated) >= {"kr-1", "kr-2"}
        assert moved_after_s < 10
        shot(page, "console-kr-flooded")
    finally:
        background.stop()
