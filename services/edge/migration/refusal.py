"""Which streams cannot be moved to another worker faithfully.

One predicate on the parsed request, so every feature that carries state the continuing
worker cannot rebuild from (prompt, delivered token ids, delivered text tail) is refused in
one place, with a reason the client reads in the stream's error event:

- structured outputs (``response_format`` json_object / json_schema) and tool calls: the
  grammar's state is rebuilt at its root on the new worker, not at the delivered position;
- ``n`` > 1: several sequences share one stream, each at its own position.

The request's own ``stream_state_portable`` says whether any of them is present; this
module says which, for the error the client reads.

What does carry over, and how (docs/migration.md): sampling parameters, the seed (the
simulator continues its seeded sequence exactly; vLLM re-seeds at the boundary), logprobs
(each chunk carries its own), stop strings (the delivered tail is matched against).
``presence_penalty`` / ``frequency_penalty`` do change: vLLM computes them over a request's
*output* tokens, and on the continuing worker the delivered tokens are part of its (token)
prompt, so after the boundary they are penalised only for tokens generated after it —
a stream that migrated penalises repeats of its earlier text less than an uninterrupted one.
(``SimEngine`` ignores penalties; its text is identical either way.)
"""

from __future__ import annotations

from services.edge.openai_types import ChatCompletionRequest


def migration_refusal(body: ChatCompletionRequest) -> str | None:
    """Why this request's stream cannot migrate, or None if it can."""
    if body.stream_state_portable:
        return None
    if body.response_format_type() != "text":
        return "structured-output streams cannot move to another worker (the grammar restarts)"
    if body.tools:
        return "tool-call streams cannot move to another worker (the grammar restarts)"
    return "streams with n > 1 cannot move to another worker"
