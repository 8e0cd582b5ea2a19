import json

import pytest

from services.common.errors import InvalidRequest
from services.edge.openai_types import parse_chat_request

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(**over: object) -> bytes:
    return json.dumps({**OK, **over}).encode()


def test_a_minimal_request_parses() -> None:
    req = parse_chat_request(body())
    assert req.model == "m"
    assert req.messages[0].text() == "hi"
    assert not req.stream


def test_content_parts_are_joined() -> None:
    req = parse_chat_request(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ]
        )
    )
    assert req.messages[0].text() == "ab"


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"\xff\xfe", None, "UTF-8"),
        (b"[1, 2]", None, "JSON object"),
        (json.dumps({"messages": OK["messages"]}).encode(), "model", "Missing required"),
        (body(messages=[]), "messages", "messages"),
        (body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", "role"),
        (body(messages=[{"content": "x"}]), "messages[0].role", "Missing required"),
        (body(temperature=3), "temperature", "temperature"),
        (body(temperature="hot"), "temperature", "number"),
        (body(top_p=0), None, None),
        (body(max_tokens=0), "max_tokens", "max_tokens"),
        (body(max_tokens=-5), "max_tokens", "max_tokens"),
        (body(max_tokens=10**12), "max_tokens", "max_tokens"),
        (body(max_tokens="10"), "max_tokens", "max_tokens"),
        (body(n=200), "n", "n"),
        (body(n=0), "n", "n"),
        (body(stop=["a", "b", "c", "d", "e"]), "stop", "stop"),
        (body(stream="yes"), "stream", "stream"),
        (body(tools=[{"type": "function"}]), "tools[0].function", "Missing"),
        (body(top_logprobs=3), "top_logprobs", "logprobs"),
        (body(stream_options={"include_usage": True}), "stream_options", "stream"),
        (body(presence_penalty=5), "presence_penalty", "presence_penalty"),
    ],
)
def test_bad_requests_name_the_field(raw: bytes, param: str | None, fragment: str | None) -> None:
    if fragment is None:  # valid edge case
        parse_chat_request(raw)
        return
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(raw)
    assert exc.value.param == param
    assert fragment.lower() in exc.value.message.lower()


def test_deeply_nested_json_is_a_clear_error_not_a_crash() -> None:
    raw = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidRequest):
        parse_chat_request(raw)


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = parse_chat_request(body(max_tokens=10, max_completion_tokens=20))
    assert req.effective_max_tokens() == 20


def test_stop_string_becomes_a_list() -> None:
    assert parse_chat_request(body(stop="END")).stop_list() == ["END"]


def test_lone_surrogate_escapes_are_refused() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(raw)
    assert exc.value.param == "messages[0].content"


@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"], ids=lambda s: s
)
def test_nan_and_infinite_numbers_are_not_json(literal: str) -> None:
    """Python's json takes them; a worker's Struct cannot carry them (a schema's ``const: NaN``
    failed on every worker it was retried on). A 400 at the edge, wherever they sit."""
    schema = '{"type": "number", "const": ' + literal + "}"
    raw = (
        '{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": '
        '{"type": "json_schema", "json_schema": {"name": "x", "schema": ' + schema + "}}}"
    ).encode()
    with pytest.raises(InvalidRequest, match=f"{literal} is"):
        parse_chat_request(raw)
    assert parse_chat_request(body(temperature=1e-300)).temperature == 1e-300  # finite: fine


def _nested_schema(depth: int, container: str) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth - 1):
        if container == "array":
            schema = {"type": "array", "items": schema}
        else:  # two JSON levels per step: the schema and its properties
            schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("where", ["response_format", "tool"])
def test_a_schema_nested_past_what_a_worker_can_decode_is_refused(where: str) -> None:
    """Schemas reach the worker as protobuf Structs, and protobuf stops decoding at 100 message
    levels (about 32 JSON levels): a deeper schema made the worker's GenerateMux call
    undecodable, every stream on it with it. Refused at the edge with the param and where."""

    def request(schema: dict[str, object]) -> bytes:
        if where == "tool":
            tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            return body(tools=tools)
        return body(
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        )

    parse_chat_request(request(_nested_schema(20, "array")))  # at the limit: accepted
    param = (
        "tools[0].function.parameters" if where == "tool" else "response_format.json_schema.schema"
    )
    for schema in (
        _nested_schema(21, "array"),
        _nested_schema(12, "object"),
        _nested_schema(400, "array"),
    ):
        with pytest.raises(InvalidRequest, match="nest more than 20 deep") as err:
            parse_chat_request(request(schema))
        assert err.value.param == param
        assert err.value.code == "invalid_schema"


def test_a_schema_at_the_depth_limit_still_decodes_inside_a_mux_frame() -> None:
    """The limit leaves room: the deepest accepted schema, as a tool's parameters (the deeper
    of the two places), inside the GenerateMux frame the edge sends, decodes on the worker."""
    from meridian.v1 import worker_pb2
    from services.common.jsonstruct import to_struct

    for container in ("array", "object"):
        schema = _nested_schema(20 if container == "array" else 10, container)
        frame = worker_pb2.MuxRequest(stream_id=1)
        tool = frame.open.request.tools.add()
        to_struct(schema, tool.function.parameters)
        to_struct(schema, frame.open.request.response_format.schema)
        worker_pb2.MuxRequest.FromString(frame.SerializeToString())


KEY = "mk-" + "A1b2_-" * 7 + "x"


@pytest.mark.parametrize(
    "pasted", [KEY, "sk-proj-" + "a" * 40, f"Bearer {KEY}", f"{KEY} ", f" {KEY}", f"{KEY}\n"]
)
def test_an_api_key_pasted_into_model_is_refused_without_echoing_it(pasted: str) -> None:
    """Arguments swapped (a common slip): the key would travel to the router and into its
    logs as the unknown model asked for."""
    with pytest.raises(InvalidRequest, match="looks like an API key") as err:
        parse_chat_request(body(model=pasted))
    assert err.value.param == "model"
    assert pasted not in err.value.message
    assert KEY not in err.value.message
    assert parse_chat_request(body(model="sk-model")).model == "sk-model"  # short: a name
    long_name = "desk-assistant-llama-3-70b-instruct-v2"  # "sk-" inside a word: a name
    assert parse_chat_request(body(model=long_name)).model == long_name


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user"}, "messages[0].content"),
        ({"role": "system", "content": None}, "messages[0].content"),
        ({"role": "assistant", "content": None}, "messages[0].content"),
    ],
)
def test_a_message_without_content_is_refused_unless_it_calls_tools(
    message: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest, match="Missing required parameter") as err:
        parse_chat_request(body(messages=[message, {"role": "user", "content": "hi"}]))
    assert err.value.param == param
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    calling = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer = {"role": "tool", "tool_call_id": "c1", "content": "done"}
    parse_chat_request(body(messages=[{"role": "user", "content": "hi"}, calling, answer]))


@pytest.mark.parametrize(
    ("over", "param", "fragment"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 items"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
            "Missing",
        ),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "at least 1 item"),
        ({"stop": 5}, "stop", "valid string"),  # no branch takes a number: the type it is
    ],
)
def test_a_union_fields_error_is_the_branch_the_input_matches(
    over: dict[str, object], param: str, fragment: str
) -> None:
    """``stop`` is a string or a list: five stops are "at most 4 items", not "should be a
    valid string" (the first branch's complaint, which pydantic lists first)."""
    with pytest.raises(InvalidRequest, match=fragment) as err:
        parse_chat_request(body(**over))
    assert err.value.param == param


@pytest.mark.parametrize(
    ("over", "param", "limit"),
    [
        ({"model": "m" * 300}, "model", "at most 256 characters"),
        ({"user": "u" * 300}, "user", "at most 256 characters"),
        ({"stop": "s" * 300}, "stop", "at most 256 characters"),
        (
            {"messages": [{"role": "user", "content": "hi", "name": "n" * 65}]},
            "messages[0].name",
            "at most 64 characters",
        ),
    ],
    ids=["model", "user", "stop", "name"],
)
def test_a_string_over_its_limit_is_counted_in_characters(
    over: dict[str, object], param: str, limit: str
) -> None:
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(body(**over))
    assert exc.value.param == param
    assert limit in exc.value.message
    assert "items" not in exc.value.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": '
            + b"9" * 5000
            + b"}",
            None,
        ),
        (
            body(logit_bias={"\u00b2": 1}),
            "logit_bias",
        ),
        (
            body(logit_bias={"\u0661\u0662": 1}),
            "logit_bias",
        ),
    ],
    ids=["5000-digit integer", "superscript two", "arabic-indic digits"],
)
def test_numbers_python_reads_oddly_are_400s(raw: bytes, param: str | None) -> None:
    """A 5,000-digit integer (Python converts at most 4,300) and a token id in non-ASCII
    digits were 500s with a traceback."""
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(raw)
    assert exc.value.param == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_openai_fields_meridian_cannot_honour_are_refused_by_name(
    extra: dict[str, object], param: str
) -> None:
    """Ignored, the answer would silently not be what was asked for."""
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request(body(**extra))
    assert (err.value.param or "").startswith(param)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"service_tier": "gold"}, "service_tier"),
        ({"store": "yes"}, "store"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"logit_bias": {"50": "50"}}, "logit_bias.50"),
        ({"logit_bias": {"50": True}}, "logit_bias.50"),
    ],
)
def test_openai_fields_without_effect_here_are_still_type_checked(
    extra: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request(body(**extra))
    assert err.value.param == param


def test_openai_fields_without_effect_here_are_accepted_when_well_formed() -> None:
    req = parse_chat_request(
        body(
            service_tier="auto",
            store=False,
            metadata={"team": "search"},
            modalities=["text"],
            logit_bias={"50": -100, "7": 2.5},
            some_sdk_extension={"anything": 1},
        )
    )
    assert req.logit_bias_pairs() == [(50, -100.0), (7, 2.5)]


def test_null_for_stream_and_encoding_format_means_the_default_as_openai_takes_it() -> None:
    from services.edge.dialects.base import parse_body
    from services.edge.openai_completions import CompletionRequest, EmbeddingRequest

    assert parse_chat_request(body(stream=None)).stream is False
    completion = parse_body(b'{"model": "m", "prompt": "x", "stream": null}', CompletionRequest)
    assert completion.stream is False
    embedding = parse_body(
        b'{"model": "m", "input": "x", "encoding_format": null}', EmbeddingRequest
    )
    assert embedding.encoding_format == "float"
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request(body(stream="yes"))
    assert err.value.param == "stream"


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "#/nowhere"}, "does not exist"),
        ({"$ref": "http://169.254.169.254/latest"}, "nothing is fetched"),
        ({"type": "object", "properties": {"a": {"$ref": "other.json"}}}, "other.json"),
    ],
)
def test_a_schema_whose_refs_do_not_resolve_is_refused_and_nothing_is_fetched(
    schema: dict[str, object], says: str
) -> None:
    """The metaschema passes a $ref pointing nowhere; the worker's grammar compiler did not."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(InvalidRequest, match=says) as err:
        parse_chat_request(body(response_format=fmt))
    assert err.value.param == "response_format.json_schema.schema"
    local = {
        "$id": "https://example.com/s",
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}},
        "$defs": {"x": {"type": "string"}},
    }
    fmt["json_schema"]["schema"] = local  # type: ignore[index]
    assert parse_chat_request(body(response_format=fmt)).response_format is not None


@pytest.mark.parametrize(
    ("part", "said"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "images"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
        ({"type": "file", "file": {"file_id": "file-1"}}, "files"),
    ],
)
def test_an_image_audio_or_file_part_is_refused_as_such(part: dict[str, object], said: str) -> None:
    parts = [{"type": "text", "text": "Look:"}, part]
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(body(messages=[{"role": "user", "content": parts}]))
    assert exc.value.param == "messages[0].content[1].type"
    assert exc.value.code == "unsupported_value"
    assert f"read text, not {said}" in exc.value.message
