import json

from meridian.v1 import worker_pb2
from services.edge.render import SSE_DONE, ChunkRenderer, completion_body


def decode(frame: bytes) -> dict:  # type: ignore[type-arg]
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    return json.loads(frame[6:-2])  # type: ignore[no-any-return]


def test_stream_chunks_follow_openai_format() -> None:
    r = ChunkRenderer(
        completion_id="chatcmpl-1", model="m", created=7, fingerprint="fp", usage=False
    )
    first = decode(r.role())
    assert first == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    content = r.content(worker_pb2.GenerateChunk(text="Hel"))
    assert content is not None
    assert decode(content)["choices"][0]["delta"] == {"content": "Hel"}
    last = decode(r.finish("stop"))
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_empty_delta_is_not_sent() -> None:
    r = ChunkRenderer(completion_id="c", model="m", created=1, fingerprint="f", usage=False)
    assert r.content(worker_pb2.GenerateChunk(text="")) is None


def test_usage_chunk_when_asked() -> None:
    r = ChunkRenderer(completion_id="c", model="m", created=1, fingerprint="f", usage=True)
    assert decode(r.role())["usage"] is None
    u = decode(r.usage(worker_pb2.Usage(prompt_tokens=3, completion_tokens=5)))
    assert u["choices"] == []
    assert u["usage"]["total_tokens"] == 8


def test_completion_body_has_message_and_usage() -> None:
    b = completion_body(
        completion_id="c",
        model="m",
        created=1,
        fingerprint="f",
        text="hi",
        finish="length",
        usage=worker_pb2.Usage(prompt_tokens=1, completion_tokens=2),
        logprobs=None,
    )
    assert b["object"] == "chat.completion"
    assert b["choices"][0]["message"] == {"role": "assistant", "content": "hi", "refusal": None}
    assert b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["prompt_tokens"] == 1


def test_fast_content_path_matches_full_rendering_byte_for_byte() -> None:
    for usage in (False, True):
        r = ChunkRenderer(
            completion_id="c-1", model='m\\"x', created=3, fingerprint="f", usage=usage
        )
        for text in ("Hel", 'quote " and \\ backslash', "ünïcødé ✓", "\n\t", "\x00"):
            fast = r.content(worker_pb2.GenerateChunk(text=text))
            slow = r._chunk({"content": text}, None)  # the reference
            assert fast == slow, text
