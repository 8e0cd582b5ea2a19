"""A completion's choices as its metrics count them: with ``n`` > 1 a prompt's tokens are
counted on its first choice only, as its usage counts them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from meridian.v1 import worker_pb2
from services.edge.stages.stream_completion import _Choice


def choice(first_of_prompt: bool) -> _Choice:
    last = worker_pb2.GenerateChunk(
        usage=worker_pb2.Usage(prompt_tokens=100, completion_tokens=7, cached_prompt_tokens=40)
    )
    upstream: Any = SimpleNamespace(first=last)
    return _Choice(1, upstream, False, first_of_prompt=first_of_prompt)


def test_only_a_prompts_first_choice_reports_its_prompt_tokens() -> None:
    first, second = choice(True).reported(), choice(False).reported()
    assert (first.usage.prompt_tokens, first.usage.cached_prompt_tokens) == (100, 40)
    assert (second.usage.prompt_tokens, second.usage.cached_prompt_tokens) == (0, 0)
    assert second.usage.completion_tokens == 7


def test_reporting_leaves_the_choices_own_chunk_alone() -> None:
    c = choice(False)
    c.reported()
    assert c.last.usage.prompt_tokens == 100
