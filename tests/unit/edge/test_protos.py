"""The edge's two upstream requests come from one module, fresh on every call: a retry never
inherits what an earlier attempt set, and no stage edits another stage's proto."""

from __future__ import annotations

import json

from services.common.jsonstruct import from_struct
from services.edge.context import ChatContext
from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens
from services.edge.tenancy.apikeys import KeyRecord
from services.edge.tenancy.auth import Principal
from services.edge.tenancy.tenants import Tenant, Tier
from services.edge.upstream import protos


def context(**body: object) -> ChatContext:
    raw = {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        **body,
    }
    ctx = ChatContext(request=None, request_id="chatcmpl-1")  # type: ignore[arg-type]
    ctx.body = parse_chat_request(json.dumps(raw).encode())
    ctx.principal = Principal(
        key=KeyRecord(key_id="k1", tenant="acme"),
        tenant=Tenant(tenant_id="acme", tier=Tier.HIGH, allowed_regions=("kr", "jp")),
    )
    ctx.prompt_tokens_estimate = estimate_prompt_tokens(ctx.body)
    ctx.session_id = "s-1"
    return ctx


def test_the_route_request_carries_what_the_router_ranks_by_and_never_the_prompt() -> None:
    long_system = "be brief. " * 60  # two full prefix blocks
    ctx = context(
        max_tokens=64,
        messages=[{"role": "system", "content": long_system}, {"role": "user", "content": "hi"}],
    )
    req = protos.route_request(ctx, site="seoul")
    assert (req.request_id, req.model, req.tenant_id, req.edge_site) == (
        "chatcmpl-1",
        "m",
        "acme",
        "seoul",
    )
    assert sorted(req.allowed_regions) == ["jp", "kr"]
    assert req.max_tokens == 64
    assert req.prompt_tokens == ctx.prompt_tokens_estimate > 0
    assert req.session_id == "s-1"
    assert len(req.prefix_hashes) == 2
    assert b"be brief" not in req.SerializeToString()


def test_each_route_request_is_fresh_and_excludes_only_what_it_is_told() -> None:
    ctx = context()
    first = protos.route_request(ctx, site="seoul", exclude=["kr-1"])
    second = protos.route_request(ctx, site="seoul")
    assert list(first.exclude_worker_ids) == ["kr-1"]
    assert list(second.exclude_worker_ids) == []
    assert first is not second


def test_each_attempt_gets_its_own_generate_request() -> None:
    ctx = context(temperature=0.5, top_p=0.9, max_tokens=32, stop=["\n\n"], seed=7)
    a = protos.generate_request(ctx, request_id="chatcmpl-1", decision_id="d1")
    b = protos.generate_request(ctx, request_id="chatcmpl-1.2", decision_id="d2")
    assert (a.request_id, a.decision_id) == ("chatcmpl-1", "d1")
    assert (b.request_id, b.decision_id) == ("chatcmpl-1.2", "d2")
    assert [(m.role, m.content) for m in a.messages] == [("system", "be brief"), ("user", "hi")]
    assert a.sampling.max_tokens == 32
    assert list(a.sampling.stop) == ["\n\n"]
    assert a.sampling.seed == 7
    assert abs(a.sampling.temperature - 0.5) < 1e-6
    assert a.messages == b.messages  # the same request, attempt fields apart


def test_a_prebuilt_payload_makes_the_same_generate_request() -> None:
    """A large request's messages, tools and response format are encoded once
    (``ctx.chat_payload``) and merged into each attempt: the result is what building it
    from the body gives, and attempts do not share a message."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    ctx = context(tools=[tool], tool_choice="required", max_tokens=8, seed=3)
    fresh = protos.generate_request(ctx, request_id="chatcmpl-1", decision_id="d1")
    assert ctx.body is not None
    ctx.chat_payload = protos.chat_payload(ctx.body)
    a = protos.generate_request(ctx, request_id="chatcmpl-1", decision_id="d1")
    b = protos.generate_request(ctx, request_id="chatcmpl-1.2", decision_id="d2")
    assert a == fresh
    assert from_struct(a.tools[0].function.parameters)["properties"]["city"]["type"] == "string"
    assert a.tools == b.tools
    assert a.tools is not b.tools
    assert len(ctx.chat_payload.tools) == 1  # merging did not grow the payload


def test_a_completion_request_carries_its_logit_bias() -> None:
    from services.edge.dialects.base import parse_body
    from services.edge.openai_completions import CompletionRequest

    ctx = context()
    ctx.completion = parse_body(
        json.dumps({"model": "m", "prompt": "x", "logit_bias": {"77": 5, "3": -100}}).encode(),
        CompletionRequest,
    )
    req = protos.completion_request(ctx, "x", request_id="cmpl-1", decision_id="d1")
    assert dict(req.sampling.logit_bias) == {77: 5.0, 3: -100.0}


def test_choice_j_of_a_seeded_completion_samples_with_seed_plus_j_wrapping_at_int64() -> None:
    from services.edge.dialects.base import parse_body
    from services.edge.openai_completions import CompletionRequest

    def seeds(seed: int) -> list[int]:
        ctx = context()
        ctx.completion = parse_body(
            json.dumps({"model": "m", "prompt": "x", "n": 3, "seed": seed}).encode(),
            CompletionRequest,
        )
        return [
            protos.completion_request(
                ctx, "x", request_id=f"c-{j}", decision_id="d", choice=j
            ).sampling.seed
            for j in range(3)
        ]

    assert seeds(7) == [7, 8, 9]
    assert seeds(2**63 - 2) == [2**63 - 2, 2**63 - 1, -(2**63)]


def test_an_unseeded_choice_stays_unseeded() -> None:
    from services.edge.dialects.base import parse_body
    from services.edge.openai_completions import CompletionRequest

    ctx = context()
    ctx.completion = parse_body(b'{"model": "m", "prompt": "x", "n": 2}', CompletionRequest)
    req = protos.completion_request(ctx, "x", request_id="c-1", decision_id="d", choice=1)
    assert not req.sampling.HasField("seed")
