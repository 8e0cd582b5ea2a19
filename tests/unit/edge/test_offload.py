"""The offload thread's JSON: the same bytes as ``json.dumps``, however the value is shaped,
encoded a slice at a time (so no single C call holds the interpreter for a whole answer)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from aiohttp import web

from services.edge import offload


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        {"a": [1] * 1000, "b": {"c": [{"d": "é\u2028"}] * 600}, "e": None},
        {"choices": [{"logprobs": {"content": [{"t": "x", "p": -0.5}] * 700}}] * 3},
        [[0.123456789] * 300 for _ in range(300)],
        {"deep": [[[[[[[1, 2, [3]]]]]]]]},
        {"nan_free": 1e300, "neg": -0.0, "s": '"\\\n'},
    ],
)
def test_json_bytes_are_json_dumps_byte_for_byte(value: Any) -> None:
    assert offload.json_bytes(value) == json.dumps(value).encode()


def test_a_long_list_is_encoded_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    dumps = json.dumps

    def counting(value: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(value, list):
            sizes.append(len(value))
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    offload.json_bytes({"content": [{"t": "x"}] * (offload.SLICE * 3 + 1)})
    assert max(sizes) == offload.SLICE
    assert sum(sizes) == offload.SLICE * 3 + 1


async def test_a_large_answer_is_built_off_the_loop_and_a_small_one_on_it() -> None:
    threads: list[str] = []

    def build() -> dict[str, str]:
        threads.append(threading.current_thread().name)
        return {"ok": "yes"}

    for items in (offload.LARGE_ANSWER_ITEMS - 1, offload.LARGE_ANSWER_ITEMS):
        resp = await offload.json_answer(build, items=items, headers={"x-a": "1"})
        assert isinstance(resp, web.Response)
        assert json.loads(resp.body) == {"ok": "yes"}  # type: ignore[arg-type]
        assert resp.content_type == "application/json"
        assert resp.headers["x-a"] == "1"
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("edge-offload")
