"""What SimEngine answers when the request asks for tools or structured output: a *script*.

Plain chat draws words from :class:`~services.worker.sim.text.TextGenerator`. A request with
tools or a JSON response format instead gets its whole answer decided up front, by a
documented rule, and then streamed one token piece at a time like any other output (so
``max_tokens`` cuts it, usage counts it and the performance model times it the same way):

Tool rule (:func:`planned_calls`), deterministic:

- ``tool_choice`` ``none`` (or no tools): no call;
- a named function: that function, once;
- ``required``: the tools the last message mentions (below), else the first tool;
- ``auto``: the tools the last message mentions, if that last message is the user's — a
  conversation whose last message is a tool result is answered in text, so agent loops end;
- "mentions": the tool's name appears in the message, case-insensitively, as a word;
  mentioned tools are called in the order they appear, all of them with
  ``parallel_tool_calls`` (the default), else only the first.

Arguments are an instance of the tool's ``parameters`` schema (services/worker/sim/jsongen.py),
seeded from the sequence's seed and the tool's name; ids are ``call_`` + 24 hex digits
derived from the seed and the call's position. A response format ``json_schema`` answers an
instance of the schema, ``json_object`` ``{"answer": "<some words>"}``. The finish reason
is ``tool_calls`` when calls were made (``stop`` for a named function, as OpenAI does),
else ``stop``; a script always ends where it ends (``ignore_eos`` does not extend it).

A script is never longer than the request's ``max_tokens``: the JSON is generated under that
budget (:func:`jsongen.render`, so a schema asking for a billion characters costs what
``max_tokens`` allows, not a billion), calls share it in order, and an answer that does not
fit is the prefix that does, finishing with ``length`` as a real engine's would. A later
call that gets no budget at all is not made.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from services.worker.engine import EngineRequest, FinishReason, ToolCallDelta, ToolSpec
from services.worker.sim import jsongen
from services.worker.sim.text import TextGenerator, seed_for, split_pieces


@dataclass(frozen=True, slots=True)
class Step:
    """One token of a script: content text, or a piece of tool call ``call``'s arguments."""

    piece: str
    call: int | None = None


@dataclass(slots=True)
class Script:
    steps: list[Step]
    call_ids: list[str]
    call_names: list[str]
    finish: FinishReason
    position: int = 0

    def __len__(self) -> int:
        return len(self.steps)

    def next(self) -> Step:
        step = self.steps[min(self.position, len(self.steps) - 1)]
        self.position += 1
        return step

    def delta(self, step: Step, *, first_of_call: bool) -> ToolCallDelta:
        assert step.call is not None
        if first_of_call:
            return ToolCallDelta(
                index=step.call,
                id=self.call_ids[step.call],
                name=self.call_names[step.call],
                arguments=step.piece,
            )
        return ToolCallDelta(index=step.call, arguments=step.piece)


def needs_script(request: EngineRequest) -> bool:
    return bool(request.tools) or request.response_format.type != "text"


def build_script(
    request: EngineRequest, seed: int, *, max_tokens: int = jsongen.DEFAULT_MAX_TOKENS
) -> Script | None:
    """The scripted answer of ``request``, or None when it is plain text; at most
    ``max_tokens`` steps (the sequence's token budget), ending in ``length`` when cut."""
    calls = planned_calls(request)
    if calls:
        steps: list[Step] = []
        ids: list[str] = []
        complete = True
        for index, tool in enumerate(calls):
            left = max_tokens - len(steps)
            if left <= 0:
                complete = False
                break
            schema = tool.parameters or {"type": "object"}
            args = jsongen.render(schema, seed_for(seed, tool.name), max_tokens=left)
            pieces = _pieces(args.text)
            steps.extend(Step(piece, index) for piece in pieces[:left])
            ids.append(f"call_{seed_for('call', seed, index):016x}{index:08x}")
            if not args.complete or len(pieces) > left:
                complete = False
                break
        if not complete:
            finish = FinishReason.LENGTH
        elif request.tool_choice.mode == "function":
            finish = FinishReason.STOP
        else:
            finish = FinishReason.TOOL_CALLS
        return Script(steps, ids, [t.name for t in calls[: len(ids)]], finish)
    fmt = request.response_format
    if fmt.type == "json_schema":
        doc = jsongen.render(fmt.schema or {}, seed_for("schema", seed), max_tokens=max_tokens)
    elif fmt.type == "json_object":
        gen = TextGenerator(seed)
        answer = "".join(gen.next_piece() for _ in range(6)).strip()
        doc = jsongen.Rendering(json.dumps({"answer": answer}, ensure_ascii=False), True)
    else:
        return None
    pieces = _pieces(doc.text)
    fits = doc.complete and len(pieces) <= max_tokens
    finish = FinishReason.STOP if fits else FinishReason.LENGTH
    return Script([Step(p) for p in pieces[:max_tokens]], [], [], finish)


def planned_calls(request: EngineRequest) -> list[ToolSpec]:
    """The tools the rule in the module docstring calls, in order."""
    choice = request.tool_choice
    tools = request.tools
    if not tools or choice.mode == "none":
        return []
    if choice.mode == "function":
        return [t for t in tools if t.name == choice.function][:1]
    last = request.messages[-1] if request.messages else None
    mentioned: list[ToolSpec] = []
    if last is not None and last.role == "user":
        found = []
        for tool in tools:
            match = re.search(rf"(?<!\w){re.escape(tool.name)}(?!\w)", last.content, re.I)
            if match:
                found.append((match.start(), tool))
        mentioned = [tool for _, tool in sorted(found, key=lambda item: item[0])]
    if not request.parallel_tool_calls:
        mentioned = mentioned[:1]
    if choice.mode == "required" and not mentioned:
        return [tools[0]]
    return mentioned


def _pieces(text: str) -> list[str]:
    return split_pieces(text) or [text]
