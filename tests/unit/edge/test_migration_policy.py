"""Migration's bounds, its refusal predicate, its flags, and the resume state it sends."""

from __future__ import annotations

import pytest

from meridian.v1 import worker_pb2
from services.edge.main import build_parser, config_from_args, main
from services.edge.migration.policy import MigrationPolicy
from services.edge.migration.refusal import migration_refusal
from services.edge.migration.resume import TAIL_CHARS, Delivered, with_resume
from services.edge.openai_types import ChatCompletionRequest, parse_chat_request
from services.edge.render import FINISH_REASONS

BASE = ["--redis-url", "redis://127.0.0.1:1/0", "--router", "127.0.0.1:2", "--plain-http"]


def request(**over: object) -> ChatCompletionRequest:
    """A chat request as the edge accepts it (validated), with ``over``'s fields."""
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **over}
    )


def test_migration_is_on_and_bounded_by_default() -> None:
    policy = config_from_args(build_parser().parse_args(BASE)).migration
    assert policy == MigrationPolicy()
    assert policy.enabled
    assert policy.max_migrations == 3
    assert policy.stall_s < policy.max_gap_s


def test_flags_reach_the_policy_and_off_turns_it_off() -> None:
    policy = config_from_args(
        build_parser().parse_args(
            [
                *BASE,
                "--migration",
                "off",
                "--migration-max-attempts",
                "5",
                "--migration-max-tokens",
                "100",
                "--migration-max-gap-s",
                "4",
                "--migration-stall-s",
                "0.5",
            ]
        )
    ).migration
    assert policy == MigrationPolicy(
        enabled=False, max_migrations=5, max_resumable_tokens=100, max_gap_s=4.0, stall_s=0.5
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--migration", "maybe"),
        ("--migration-max-attempts", "0"),
        ("--migration-max-tokens", "-3"),
        ("--migration-max-gap-s", "0"),
        ("--migration-stall-s", "nan-ish"),
        ("--migration-stall-s", "nan"),
        ("--migration-max-gap-s", "inf"),
    ],
)
def test_bad_migration_flags_stop_the_edge_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*BASE, flag, value])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_a_stall_threshold_above_the_gap_budget_is_refused_naming_both_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*BASE, "--migration-stall-s", "20", "--migration-max-gap-s", "10"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--migration-stall-s" in err
    assert "--migration-max-gap-s" in err


def test_ordinary_requests_migrate() -> None:
    body = parse_chat_request(
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true,'
        b'"top_logprobs":2,"stop":["x"],"seed":1,"presence_penalty":1,'
        b'"response_format":{"type":"text"}}'
    )
    assert migration_refusal(body) is None


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "out", "schema": {"type": "object"}},
                }
            },
            "structured-output",
        ),
        ({"response_format": {"type": "json_object"}}, "structured-output"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool-call"),
        ({"n": 2}, "n > 1"),
    ],
)
def test_state_that_cannot_be_carried_is_refused_with_a_reason(
    over: dict[str, object], words: str
) -> None:
    reason = migration_refusal(request(**over))
    assert reason is not None
    assert words in reason


def test_delivered_counts_ids_characters_and_keeps_a_bounded_tail() -> None:
    d = Delivered()
    d.add(worker_pb2.GenerateChunk(text="héllo", token_ids=[1, 2]))
    d.add(worker_pb2.GenerateChunk(text="", token_ids=[3]))  # held back by the worker
    d.add(worker_pb2.GenerateChunk(text="x" * 300, token_ids=[4]))
    assert d.token_ids == [1, 2, 3, 4]
    assert d.text_chars == 305
    assert len(d.tail) == TAIL_CHARS


def test_the_resume_state_rides_on_a_fresh_request_and_nothing_delivered_is_a_restart() -> None:
    fresh = worker_pb2.GenerateRequest(request_id="r.m1", model="m")
    assert not with_resume(fresh, Delivered(), origin_request_id="r", migrations=1).HasField(
        "resume"
    )
    d = Delivered()
    d.add(worker_pb2.GenerateChunk(text="ab", token_ids=[7, 8]))
    req = with_resume(
        worker_pb2.GenerateRequest(request_id="r.m1", model="m"),
        d,
        origin_request_id="r",
        migrations=2,
    )
    assert list(req.resume.delivered_token_ids) == [7, 8]
    assert req.resume.delivered_text_chars == 2
    assert req.resume.delivered_text_tail == "ab"
    assert req.resume.origin_request_id == "r"
    assert req.resume.migrations == 2


def test_an_aborted_generation_is_never_rendered_as_length() -> None:
    assert worker_pb2.FINISH_REASON_ABORT not in FINISH_REASONS
