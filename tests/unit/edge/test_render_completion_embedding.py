"""The wire shapes of text completions and embeddings, without a server: OpenAI's
``text_completion`` (whole and chunked, legacy logprobs with echo) and the embeddings list in
float and base64 (little-endian float32)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from meridian.v1 import worker_pb2
from services.common.errors import InvalidRequest
from services.edge.openai_completions import checked_inputs
from services.edge.render_completion import (
    CompletionChunkRenderer,
    LogprobsBuilder,
    choice,
    completion_body,
)
from services.edge.render_embedding import base64_floats, embeddings_body


def lp(token: str, logprob: float, *top: tuple[str, float]) -> worker_pb2.TokenLogprob:
    entry = worker_pb2.TokenLogprob(token=token, logprob=logprob)
    for t, v in top:
        entry.top.add(token=t, logprob=v)
    return entry


def test_echoed_logprobs_start_with_the_prompt_whose_first_token_has_none() -> None:
    b = LogprobsBuilder()
    b.add([lp("Hello", 0.0), lp(" world", -1.5, (" world", -1.5), (" there", -2.0))], prompt=True)
    b.add([lp("!", -0.25, ("!", -0.25))])
    assert b.as_dict() == {
        "tokens": ["Hello", " world", "!"],
        "token_logprobs": [None, -1.5, -0.25],
        "top_logprobs": [None, {" world": -1.5, " there": -2.0}, {"!": -0.25}],
        "text_offset": [0, 5, 11],
    }


def test_a_prompt_whose_logprobs_come_in_several_chunks_has_one_first_token() -> None:
    b = LogprobsBuilder()
    b.add([lp("Hello", 0.0)], prompt=True)
    b.add([lp(" world", -1.5, (" world", -1.5))], prompt=True)  # the next piece
    assert b.as_dict()["token_logprobs"] == [None, -1.5]
    assert b.as_dict()["top_logprobs"] == [None, {" world": -1.5}]


def test_top_logprobs_hold_the_sampled_token_too_up_to_logprobs_plus_one() -> None:
    b = LogprobsBuilder()
    b.add([lp("a", -3.0, ("b", -0.5), ("c", -1.0)), lp("b", -0.5, ("b", -0.5), ("c", -1.0))])
    assert b.as_dict()["top_logprobs"] == [
        {"b": -0.5, "c": -1.0, "a": -3.0},  # sampled outside the top 2: three entries
        {"b": -0.5, "c": -1.0},
    ]


def test_streamed_logprob_deltas_continue_the_offsets() -> None:
    b = LogprobsBuilder()
    b.add([lp("ab", -1.0)])
    assert b.delta()["text_offset"] == [0]
    b.add([lp("cd", -1.0), lp("e", -1.0)])
    assert b.delta() == {
        "tokens": ["cd", "e"],
        "token_logprobs": [-1.0, -1.0],
        "top_logprobs": [{"cd": -1.0}, {"e": -1.0}],  # logprobs: 0 is the sampled token
        "text_offset": [2, 4],
    }
    assert b.as_dict()["tokens"] == ["ab", "cd", "e"]


def test_a_text_completion_has_openais_fields() -> None:
    usage = worker_pb2.Usage(prompt_tokens=3, completion_tokens=2)
    body = completion_body(
        completion_id="cmpl-1",
        model="m",
        created=7,
        fingerprint="meridian-kr",
        choices=[choice(index=0, text="hi", logprobs=None, finish="length")],
        usage=usage,
    )
    assert body == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "system_fingerprint": "meridian-kr",
        "choices": [{"text": "hi", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def test_completion_chunks_carry_a_null_usage_when_usage_is_streamed() -> None:
    r = CompletionChunkRenderer(
        completion_id="cmpl-1", model="m", created=7, fingerprint="f", usage=True
    )
    data = json.loads(r.chunk(index=1, text="x", logprobs=None, finish=None)[6:])
    assert data["object"] == "text_completion"
    assert data["choices"] == [{"text": "x", "index": 1, "logprobs": None, "finish_reason": None}]
    assert data["usage"] is None
    last = json.loads(r.usage(worker_pb2.Usage(prompt_tokens=1, completion_tokens=1))[6:])
    assert last["choices"] == []
    assert last["usage"]["total_tokens"] == 2


def test_base64_embeddings_are_little_endian_float32() -> None:
    values = [0.5, -0.25, 1.0]
    assert base64.b64decode(base64_floats(values)) == struct.pack("<3f", *values)
    resp = worker_pb2.EmbedResponse()
    resp.embeddings.add(values=values, prompt_tokens=2)
    resp.usage.prompt_tokens = 2
    body = embeddings_body(model="m", response=resp, encoding_format="float")
    assert body == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": values}],
        "model": "m",
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("text", ["text"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_the_four_input_shapes_become_one_entry_per_input(
    value: object, expected: list[object]
) -> None:
    assert checked_inputs(value, "input", max_items=8, max_chars=100) == expected


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([], "input"),
        ("", "input"),
        (["a", ""], "input[1]"),
        ([1, -1], "input"),
        ([[1], [True]], "input[1]"),
        ([1, "a"], "input[1]"),
        (["x" * 101], "input[0]"),
        (["a"] * 9, "input"),
        ({"a": 1}, "input"),
        (None, "input"),
    ],
)
def test_a_bad_input_is_named_by_its_index(value: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        checked_inputs(value, "input", max_items=8, max_chars=100)
    assert err.value.param == param
