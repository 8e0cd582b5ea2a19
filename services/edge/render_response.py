"""OpenAI Responses API shapes: the ``response`` object and its stream of typed events.

Pure functions and one stateful event renderer, so the wire format is tested without a
server. The stream follows OpenAI's order: ``response.created``, ``response.in_progress``;
per output item ``response.output_item.added`` (a message: then ``content_part.added``,
``output_text.delta``…, ``output_text.done``, ``content_part.done``; a function call:
``function_call_arguments.delta``…, ``function_call_arguments.done``),
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete`` when
``max_output_tokens`` ran out). Items are numbered (``output_index``) in the order they
start, which is how the SDKs' stream helpers assemble them. Every event has a
``sequence_number``, from 0. A failure after the headers went out is an ``error`` event,
then ``response.failed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.edge.openai_responses import JsonSchemaTextFormat, ResponsesRequest
from services.edge.render import logprobs_dict


def response_usage(usage: worker_pb2.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        # Written to the cache: what was computed rather than read from it (prefix caching
        # keeps every prompt token it computes).
        "input_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "cache_write_tokens": max(0, usage.prompt_tokens - usage.cached_prompt_tokens),
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def token_logprobs(lps: list[worker_pb2.TokenLogprob]) -> list[dict[str, Any]]:
    """Per-token logprobs as ``output_text.logprobs`` holds them: chat's entries
    (:func:`~services.edge.render.logprobs_dict`), the same shape."""
    return logprobs_dict(lps)["content"]  # type: ignore[no-any-return]


def _text_param(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, JsonSchemaTextFormat):
        out: dict[str, Any] = {
            "type": "json_schema",
            "name": fmt.name,
            "schema": fmt.schema_,
            "strict": fmt.strict,
        }
        if fmt.description is not None:
            out["description"] = fmt.description
        return {"format": out, "verbosity": "medium"}
    return {"format": {"type": fmt.type if fmt is not None else "text"}, "verbosity": "medium"}


def _tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t["name"],
            "description": t.get("description"),
            "parameters": t.get("parameters"),
            "strict": t.get("strict"),
        }
        for t in req.tools or ()
    ]


def response_object(
    *,
    response_id: str,
    req: ResponsesRequest,
    created: int,
    status: str,
    output: list[dict[str, Any]],
    usage: worker_pb2.Usage | None,
    error: MeridianError | None = None,
    extension: dict[str, Any] | None = None,
    store: bool = False,
) -> dict[str, Any]:
    """One ``response``; the request's own settings are echoed as OpenAI echoes them, and
    ``store`` says whether it is kept (and can be gone on from)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": {"code": _failed_code(error), "message": error.message}
        if error is not None
        else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": store,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "text": _text_param(req),
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": _tools(req),
        "top_logprobs": req.top_logprobs or 0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "truncation": req.truncation or "disabled",
        "usage": response_usage(usage) if usage is not None else None,
        "user": req.user,
        "metadata": req.metadata or {},
    }
    if extension is not None:
        body["meridian"] = extension
    return body


def _failed_code(error: MeridianError) -> str:
    """A failed response's ``error.code``, from OpenAI's list: a limit, or the server's."""
    return "rate_limit_exceeded" if error.http_status == 429 else "server_error"


def status_of(finish: str) -> str:
    """A chat finish reason → the response's status (``length``: max_output_tokens)."""
    return "incomplete" if finish == "length" else "completed"


def message_item(
    item_id: str,
    text: str,
    status: str,
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    part["logprobs"] = logprobs if logprobs is not None else []
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(
    response_id: str, choice: dict[str, Any], logprobs: list[worker_pb2.TokenLogprob] | None
) -> list[dict[str, Any]]:
    """A chat choice (as ``ChoiceAssembler`` renders it) → the response's output items: the
    message when there is text, then each function call."""
    suffix = response_id.removeprefix("resp_")
    message = choice["message"]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    items: list[dict[str, Any]] = []
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if text or not calls:
        lps = token_logprobs(logprobs) if logprobs is not None else None
        items.append(message_item(f"msg_{suffix}", text, status, lps))
    for i, call in enumerate(calls):
        fn = call["function"]
        items.append(call_item(f"fc_{suffix}_{i}", call["id"], fn["name"], fn["arguments"], status))
    return items


def assistant_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output items → the chat message the next turn's context holds."""
    text = "".join(
        part.get("text", "")
        for item in output
        if item["type"] == "message"
        for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def sse_event(payload: dict[str, Any]) -> bytes:
    """One typed event: ``event: <type>`` and its JSON, as OpenAI sends them."""
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


@dataclass(slots=True)
class _Item:
    output_index: int
    item_id: str
    kind: str  # "message" | "function_call"
    parts: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None
    call_id: str = ""
    name: str = ""
    status: str | None = None  # once its closing events are sent


class ResponseEvents:
    """The events of one streamed response, rendered as the chunks arrive.

    Items follow one another as on OpenAI's: when the next item starts (a function call
    after the text, or the next call), the one before is closed (``…done`` and
    ``output_item.done``, status ``completed``), so a client that acts on a finished item, an
    agent loop running a call on its ``output_item.done``, need not wait for the whole
    answer. The last item closes with the response's own status.
    """

    def __init__(
        self,
        *,
        response_id: str,
        req: ResponsesRequest,
        created: int,
        logprobs: bool,
        store: bool = False,
    ) -> None:
        self._id = response_id
        self.store = store  # what the events say; the final one says what happened
        self._suffix = response_id.removeprefix("resp_")
        self._req = req
        self._created = created
        self._logprobs = logprobs
        self._seq = 0
        self._started = False
        self._message: _Item | None = None  # the message item text goes to now
        self._calls: dict[int, _Item] = {}  # by the worker's tool-call index
        self._items: list[_Item] = []
        self._opening = b""  # an empty answer's message, opened by final()

    def _event(self, payload: dict[str, Any]) -> bytes:
        payload["sequence_number"] = self._seq
        self._seq += 1
        return sse_event(payload)

    def _response(
        self,
        status: str,
        usage: worker_pb2.Usage | None = None,
        *,
        error: MeridianError | None = None,
        extension: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        item_status = "in_progress" if status == "in_progress" else status
        if status == "failed":
            item_status = "incomplete"
        output = [self._rendered(item, item_status) for item in self._items]
        return response_object(
            response_id=self._id,
            req=self._req,
            created=self._created,
            status=status,
            output=output,
            usage=usage,
            error=error,
            extension=extension,
            store=self.store,
        )

    def _rendered(self, item: _Item, status: str) -> dict[str, Any]:
        status = item.status or status
        if item.kind == "message":
            return message_item(item.item_id, "".join(item.parts), status, item.logprobs)
        return call_item(item.item_id, item.call_id, item.name, "".join(item.parts), status)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``, in one write."""
        self._started = True
        response = self._response("in_progress")
        return self._event({"type": "response.created", "response": response}) + self._event(
            {"type": "response.in_progress", "response": response}
        )

    def chunk(self, chunk: worker_pb2.GenerateChunk) -> bytes:
        """The events for one worker chunk: text deltas and function-call pieces (b"" when it
        carries neither)."""
        out = b""
        if chunk.text or (chunk.logprobs and not chunk.tool_calls):
            out += self._text(chunk)
        for call in chunk.tool_calls:
            out += self._call_piece(call)
        return out

    def _open_message(self) -> tuple[_Item, bytes]:
        """The message item text goes to, opened (closing the item before it) if need be: the
        first message is ``msg_<id>``; text after a function call starts another."""
        item = self._message
        if item is not None and item.status is None:
            return item, b""
        out = self._close_open("completed")
        messages = sum(1 for i in self._items if i.kind == "message")
        item_id = f"msg_{self._suffix}" + (f"_{messages}" if messages else "")
        item = _Item(len(self._items), item_id, "message")
        item.logprobs = [] if self._logprobs else None
        self._message = item
        self._items.append(item)
        out += self._event(
            {
                "type": "response.output_item.added",
                "output_index": item.output_index,
                "item": message_item(item.item_id, "", "in_progress", []),
            }
        )
        out += self._event(
            {
                "type": "response.content_part.added",
                "item_id": item.item_id,
                "output_index": item.output_index,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            }
        )
        return item, out

    def _text(self, chunk: worker_pb2.GenerateChunk) -> bytes:
        item, out = self._open_message()
        item.parts.append(chunk.text)
        lps = token_logprobs(list(chunk.logprobs)) if self._logprobs and chunk.logprobs else []
        if item.logprobs is not None:
            item.logprobs.extend(lps)
        out += self._event(
            {
                "type": "response.output_text.delta",
                "item_id": item.item_id,
                "output_index": item.output_index,
                "content_index": 0,
                "delta": chunk.text,
                "logprobs": lps,
            }
        )
        return out

    def _call_piece(self, call: worker_pb2.ToolCallDelta) -> bytes:
        out = b""
        item = self._calls.get(call.index)
        if item is None:
            out += self._close_open("completed")
            item = _Item(
                len(self._items),
                f"fc_{self._suffix}_{len(self._calls)}",
                "function_call",
                call_id=call.id,
                name=call.name,
            )
            self._calls[call.index] = item
            self._items.append(item)
            out += self._event(
                {
                    "type": "response.output_item.added",
                    "output_index": item.output_index,
                    "item": call_item(item.item_id, item.call_id, item.name, "", "in_progress"),
                }
            )
        if call.arguments:
            # (Parsers finish a call before the next starts; a late piece of a closed call
            # still reaches the final response and its delta is still sent.)
            item.parts.append(call.arguments)
            out += self._event(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.item_id,
                    "output_index": item.output_index,
                    "delta": call.arguments,
                }
            )
        return out

    def final(
        self, finish: str, usage: worker_pb2.Usage, extension: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The finished ``response`` (what is stored, and what the last event carries)."""
        if not self._items:  # nothing generated: still one (empty) message, as OpenAI's
            self._opening = self._open_message()[1]
        return self._response(status_of(finish), usage, extension=extension)

    def finish(self, response: dict[str, Any]) -> bytes:
        """The open item's closing events, then ``response.completed`` /
        ``response.incomplete`` carrying ``response`` (from :meth:`final`)."""
        status = response["status"]
        out, self._opening = self._opening, b""
        out += self._close_open(status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event({"type": kind, "response": response})

    def _close_open(self, status: str) -> bytes:
        """The closing events of every item not yet closed, which then keep ``status``."""
        out = b""
        for item in self._items:
            if item.status is not None:
                continue
            rendered = self._rendered(item, status)
            item.status = status
            if item.kind == "message":
                text = rendered["content"][0]["text"]
                out += self._event(
                    {
                        "type": "response.output_text.done",
                        "item_id": item.item_id,
                        "output_index": item.output_index,
                        "content_index": 0,
                        "text": text,
                        "logprobs": item.logprobs or [],
                    }
                )
                out += self._event(
                    {
                        "type": "response.content_part.done",
                        "item_id": item.item_id,
                        "output_index": item.output_index,
                        "content_index": 0,
                        "part": rendered["content"][0],
                    }
                )
            else:
                out += self._event(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item.item_id,
                        "output_index": item.output_index,
                        "name": item.name,
                        "arguments": rendered["arguments"],
                    }
                )
            out += self._event(
                {
                    "type": "response.output_item.done",
                    "output_index": item.output_index,
                    "item": rendered,
                }
            )
        return out

    def failed(self, err: MeridianError, usage: worker_pb2.Usage | None) -> bytes:
        """A failure after the headers: an ``error`` event, then ``response.failed`` (after
        ``response.created`` and ``in_progress`` when it came before the first token)."""
        opening = b"" if self._started else self.start()
        error = self._event(
            {
                "type": "error",
                "code": err.code or err.openai_type,
                "message": err.message,
                "param": err.param,
            }
        )
        response = self._response("failed", usage, error=err)
        return opening + error + self._event({"type": "response.failed", "response": response})
