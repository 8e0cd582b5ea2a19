from typing import Any

import pytest

from meridian.v1 import worker_pb2
from services.common.errors import InvalidRequest
from services.worker.convert import chunk_to_pb, request_from_pb
from services.worker.engine import EngineOutput, FinishReason


def request(**sampling: object) -> worker_pb2.GenerateRequest:
    req = worker_pb2.GenerateRequest(request_id="r1", model="m")
    req.messages.add(role="user", content="hello")
    for k, v in sampling.items():
        if k == "stop":
            req.sampling.stop.extend(v)  # type: ignore[arg-type]
        else:
            setattr(req.sampling, k, v)
    return req


def test_a_valid_request_converts() -> None:
    r = request(temperature=0.5, max_tokens=10, seed=3, stop=["x"])
    er = request_from_pb(r)
    assert er.sampling.temperature == 0.5
    assert er.sampling.max_tokens == 10
    assert er.sampling.seed == 3
    assert er.sampling.stop == ("x",)
    assert er.sampling.top_p is None  # unset stays unset


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("top_logprobs", 50),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", [""]),
    ],
)
def test_bad_sampling_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidRequest) as exc:
        request_from_pb(request(**{field: value}))
    assert exc.value.param == field


def test_zero_max_tokens_is_refused() -> None:
    with pytest.raises(InvalidRequest) as exc:
        request_from_pb(request(max_tokens=0))
    assert exc.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (lambda r: setattr(r, "request_id", ""), "request_id"),
        (lambda r: setattr(r, "model", ""), "model"),
        (lambda r: r.ClearField("messages"), "messages"),
        (lambda r: setattr(r.messages[0], "role", "wizard"), "messages[0].role"),
    ],
)
def test_bad_request_fields_are_named(mutate, param: str) -> None:  # type: ignore[no-untyped-def]
    r = request()
    mutate(r)
    with pytest.raises(InvalidRequest) as exc:
        request_from_pb(r)
    assert exc.value.param == param


def test_final_chunk_carries_finish_usage_and_timings() -> None:
    pb = chunk_to_pb(
        EngineOutput(
            text="!",
            token_ids=(5,),
            finish_reason=FinishReason.LENGTH,
            prompt_tokens=4,
            completion_tokens=9,
            decode_ms=12.5,
        )
    )
    assert pb.finish_reason == worker_pb2.FINISH_REASON_LENGTH
    assert (pb.usage.prompt_tokens, pb.usage.completion_tokens) == (4, 9)
    assert pb.timings.decode_ms == 12.5
    assert list(pb.token_ids) == [5]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_schema_struct_that_is_not_json_is_refused_naming_it(bad: float) -> None:
    """A Struct holds what JSON cannot; sent straight to the worker's gRPC port it was the
    call's INTERNAL (a ValueError), not this request's INVALID_ARGUMENT."""
    tool_req = request()
    tool = tool_req.tools.add(type="function")
    tool.function.name = "f"
    tool.function.parameters["maximum"] = bad
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(tool_req)
    assert err.value.param == "tools[0].function.parameters"
    fmt_req = request()
    fmt_req.response_format.type = worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
    fmt_req.response_format.name = "x"
    fmt_req.response_format.schema["minimum"] = bad
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(fmt_req)
    assert err.value.param == "response_format.json_schema.schema"


@pytest.mark.parametrize(
    ("field", "set_it"),
    [
        ("tools", lambda r: r.tools.add(type="function").function.__setattr__("name", "f")),
        ("response_format", lambda r: r.response_format.__setattr__("type", 1)),
        ("n", lambda r: r.__setattr__("n", 2)),
        ("resume", lambda r: r.resume.delivered_token_ids.append(5)),
        ("parallel_tool_calls", lambda r: r.__setattr__("parallel_tool_calls", False)),
    ],
)
def test_chat_only_fields_with_a_raw_prompt_are_refused_not_dropped(field: str, set_it) -> None:  # type: ignore[no-untyped-def]
    req = worker_pb2.GenerateRequest(request_id="r1", model="m")
    req.raw_prompt.text = "once upon"
    request_from_pb(req)  # a plain raw prompt converts
    set_it(req)
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(req)
    assert err.value.param == field


@pytest.mark.parametrize("priority", [-1, 4, 2**31 - 1, -(2**31)])
def test_a_priority_that_is_not_a_router_priority_is_refused(priority: int) -> None:
    req = request()
    req.priority = 3
    assert request_from_pb(req).priority == 3
    req.priority = priority
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(req)
    assert err.value.param == "priority"


def _json_schema_request(schema: dict[str, Any]) -> worker_pb2.GenerateRequest:
    r = request()
    r.response_format.type = worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
    r.response_format.name = "x"
    r.response_format.schema.update(schema)
    return r


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_schema_nested_past_the_shared_depth_is_refused_at_the_worker() -> None:
    """``limits.MAX_SCHEMA_DEPTH`` held only at the edge: a gRPC caller's deeper schema went
    on to the engine. Each properties level is two containers deep."""
    from services.common import limits

    ok = _nested(limits.MAX_SCHEMA_DEPTH // 2)
    assert request_from_pb(_json_schema_request(ok)).response_format.schema == ok
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(_json_schema_request(_nested(limits.MAX_SCHEMA_DEPTH // 2 + 1)))
    assert err.value.param == "response_format.json_schema.schema"
    assert f"more than {limits.MAX_SCHEMA_DEPTH} deep" in err.value.message
    tool_req = request()
    tool = tool_req.tools.add(type="function")
    tool.function.name = "f"
    tool.function.parameters.update(_nested(limits.MAX_SCHEMA_DEPTH))
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(tool_req)
    assert err.value.param == "tools[0].function.parameters"


@pytest.mark.parametrize(
    "schema",
    [{"type": 5}, {"type": "object", "properties": {"a": {"minimum": "zero"}}}],
    ids=["type-5", "minimum-string"],
)
def test_a_schema_its_metaschema_refuses_is_refused_naming_it(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(_json_schema_request(schema))
    assert err.value.param == "response_format.json_schema.schema"
    assert "not a valid JSON schema" in err.value.message


def test_a_schema_naming_an_unknown_draft_is_refused_and_nothing_is_fetched() -> None:
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(_json_schema_request({"$schema": "http://10.255.255.1/schema"}))
    assert "$schema must name a JSON-schema draft" in err.value.message


def test_resume_with_several_choices_is_refused_naming_resume() -> None:
    """The delivered tokens are one sequence's: with n > 1 every choice was given them."""
    from services.worker.convert import choices_from_pb

    r = request(max_tokens=50)
    r.resume.delivered_token_ids.extend([5, 6])
    r.n = 2
    with pytest.raises(InvalidRequest) as err:
        choices_from_pb(r)
    assert err.value.param == "resume"
    assert "n = 2" in err.value.message
    r.n = 1
    assert choices_from_pb(r) == 1


def _with_tool_turn(call_id: str = "call-1", calls: int = 1) -> worker_pb2.GenerateRequest:
    r = request()
    assistant = r.messages.add(role="assistant")
    for j in range(calls):
        assistant.tool_calls.add(id=f"call-{j}", name="f", arguments="{}")
    r.messages.add(role="tool", content="42", tool_call_id=call_id)
    return r


@pytest.mark.parametrize(
    ("build", "param"),
    [
        (lambda: _with_tool_turn(call_id="x" * 3_000_000), "messages[2].tool_call_id"),
        (lambda: _with_tool_turn(calls=50_000), "messages[1].tool_calls"),
        (lambda: _with_tool_turn(call_id="call-0", calls=1), None),
    ],
    ids=["tool_call_id-3MB", "50000-tool-calls", "ok"],
)
def test_tool_turn_fields_are_bounded_naming_the_field(build, param: str | None) -> None:  # type: ignore[no-untyped-def]
    r = build()
    if param is None:
        assert request_from_pb(r).messages[2].tool_call_id == "call-0"
        return
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(r)
    assert err.value.param == param


@pytest.mark.parametrize("field", ["tenant_id", "decision_id"])
def test_tenant_and_decision_ids_are_bounded_naming_the_field(field: str) -> None:
    from services.worker.convert import embed_request_from_pb

    r = request()
    setattr(r, field, "t" * 3_000_000)
    with pytest.raises(InvalidRequest) as err:
        request_from_pb(r)
    assert err.value.param == field
    e = worker_pb2.EmbedRequest(request_id="e", model="m", inputs=[worker_pb2.RawPrompt(text="x")])
    setattr(e, field, "t" * 3_000_000)
    with pytest.raises(InvalidRequest) as err:
        embed_request_from_pb(e)
    assert err.value.param == field
    setattr(r, field, "t" * 64)
    assert request_from_pb(r).request_id == "r1"
