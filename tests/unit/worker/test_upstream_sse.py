"""The upstream engine's SSE parser and chunk assembly, fed the byte splits a socket gives."""

from __future__ import annotations

import pytest

from services.common.errors import UpstreamFailed
from services.worker.engine import FinishReason
from services.worker.upstream.scrape import parse_vllm_metrics
from services.worker.upstream.sse import SseError, SseParser
from services.worker.upstream.wire import StreamAssembler

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("step", [1, 2, 7, 64, len(STREAM)])
def test_events_split_anywhere_come_out_whole_and_in_order(step: int) -> None:
    parser, events = SseParser(), []
    for i in range(0, len(STREAM), step):
        events += parser.feed(STREAM[i : i + step])
    assert len(events) == 5
    assert events[-1] == b"[DONE]"
    assert not parser.pending()


def test_a_line_without_end_beyond_the_limit_is_an_error() -> None:
    with pytest.raises(SseError):
        SseParser(max_line_bytes=16).feed(b"data: " + b"x" * 32)


def test_one_read_of_many_events_is_one_output_with_the_upstreams_usage() -> None:
    assembler = StreamAssembler()
    out = assembler.feed(SseParser().feed(STREAM))
    assert out is not None
    assert out.text == "Hello"
    assert out.finish_reason is FinishReason.STOP
    assert (out.prompt_tokens, out.completion_tokens) == (4, 2)
    assert assembler.done


def test_a_role_only_chunk_yields_nothing() -> None:
    first = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    assert StreamAssembler().feed([first]) is None


def test_an_error_event_fails_the_request() -> None:
    with pytest.raises(UpstreamFailed, match="out of memory"):
        StreamAssembler().feed([b'{"error":{"message":"out of memory"}}'])


@pytest.mark.parametrize("event", [b"[" * 100_000, b'{"id": ' + b"9" * 5000 + b"}"])
def test_an_event_nested_past_the_stack_or_with_a_huge_number_fails_the_request(
    event: bytes,
) -> None:
    with pytest.raises(UpstreamFailed, match="not JSON"):
        StreamAssembler().feed([event])


def test_a_length_finish_is_length() -> None:
    a = StreamAssembler()
    out = a.feed([b'{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}'])
    assert out is not None
    assert out.finish_reason is None  # waits for the usage or [DONE]
    final = a.feed([b"[DONE]"])
    assert final is not None
    assert final.finish_reason is FinishReason.LENGTH


def test_vllm_metrics_are_read_and_other_pages_are_not_vllm() -> None:
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    load = parse_vllm_metrics(page)
    assert load is not None
    assert (load.running, load.waiting, load.kv_cache_usage) == (5, 1, 0.5)
    assert parse_vllm_metrics("process_cpu_seconds_total 1.0\n") is None
