"""vLLM's streamed ``RequestOutput`` deltas to Meridian's :class:`EngineOutput`, per request.

Reads vLLM's public output objects by duck typing (no vllm import), as requested with
``output_kind=DELTA`` and ``n=1``: each output carries only the new tokens, text and
logprobs of one engine step; the last has ``finished`` set and a finish reason.

- Usage: prompt tokens are the engine's count (``len(prompt_token_ids)``), completion tokens
  the running sum of the token ids the engine streamed, cached prompt tokens the engine's
  ``num_cached_tokens`` (prefix-cache hits).
- Timings come from the request's engine-core timestamps (``RequestOutput.metrics``,
  present while vLLM's stats are on): queue = scheduled - queued, prefill = first token -
  scheduled, decode = last token - first token. Without them they are measured here, around
  the call, on the passed-in clock: prefill = first output - submission (so it includes the
  queue, and queue_ms stays None), decode = last output - first output.
  Queue and prefill are sent on the first output and again on the last; decode on the last.
- Finish reasons: "stop" (EOS or a stop string), "length" (max_tokens or the context),
  "abort". vLLM's "repetition" (only when repetition detection is asked for, which Meridian
  never does) is a stop; its "error" (a request-level engine failure) is raised as
  :class:`InternalError`.
"""

from __future__ import annotations

import math
from typing import Any

from services.common.clock import Clock
from services.common.errors import InternalError
from services.worker.engine import EngineOutput, FinishReason, TokenLogprob

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
    "repetition": FinishReason.STOP,
}


class OutputAssembler:
    """Converts one request's outputs, keeping the cumulative usage and the timing marks."""

    def __init__(
        self, *, prompt_tokens: int, top_logprobs: int, clock: Clock, carried: int = 0
    ) -> None:
        # ``carried``: tokens a migrated stream delivered before this worker; they are part of
        # vLLM's token prompt but are reported as completion tokens (the original request's
        # usage: its prompt, all its completion tokens, each once).
        self._carried = carried
        self._prompt_tokens = prompt_tokens
        self._top_logprobs = top_logprobs
        self._clock = clock
        self._submitted = clock.monotonic()
        self._first_at: float | None = None
        self._completion_tokens = carried
        self._cached_tokens = 0

    def convert(self, output: Any) -> EngineOutput:
        now = self._clock.monotonic()
        first = self._first_at is None
        if self._first_at is None:
            self._first_at = now
        completion = output.outputs[0]
        token_ids = tuple(map(int, completion.token_ids))
        self._completion_tokens += len(token_ids)
        if output.prompt_token_ids is not None:
            self._prompt_tokens = len(output.prompt_token_ids) - self._carried
        if output.num_cached_tokens is not None:
            # A continued stream's token prompt holds the carried tokens too; the cached
            # count reported is the share of the request's own prompt.
            self._cached_tokens = min(int(output.num_cached_tokens), self._prompt_tokens)
        finish = _finish_reason(completion.finish_reason) if output.finished else None
        result = EngineOutput(
            text=completion.text,
            token_ids=token_ids,
            finish_reason=finish,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion_tokens,
            cached_prompt_tokens=self._cached_tokens,
            logprobs=self._logprobs(token_ids, completion.logprobs),
        )
        if first or finish is not None:
            self._set_timings(result, output.metrics, now, last=finish is not None)
        return result

    def _set_timings(self, result: EngineOutput, metrics: Any, now: float, *, last: bool) -> None:
        queued = _stamp(metrics, "queued_ts")
        scheduled = _stamp(metrics, "scheduled_ts")
        first_token = _stamp(metrics, "first_token_ts")
        last_token = _stamp(metrics, "last_token_ts")
        if queued is not None and scheduled is not None and scheduled >= queued:
            result.queue_ms = (scheduled - queued) * 1000.0
        if scheduled is not None and first_token is not None and first_token >= scheduled:
            result.prefill_ms = (first_token - scheduled) * 1000.0
        elif result.queue_ms is None and self._first_at is not None:
            result.prefill_ms = (self._first_at - self._submitted) * 1000.0
        if not last:
            return
        if first_token is not None and last_token is not None and last_token >= first_token:
            result.decode_ms = (last_token - first_token) * 1000.0
        elif self._first_at is not None:
            result.decode_ms = (now - self._first_at) * 1000.0

    def _logprobs(self, token_ids: tuple[int, ...], entries: Any) -> tuple[TokenLogprob, ...]:
        if not entries:
            return ()
        out: list[TokenLogprob] = []
        for token_id, candidates in zip(token_ids, entries, strict=False):
            chosen = candidates.get(token_id)
            top = sorted(
                (c for c in candidates.values() if c.rank is not None),
                key=lambda c: c.rank,
            )[: self._top_logprobs]
            out.append(
                TokenLogprob(
                    token=(chosen.decoded_token or "") if chosen is not None else "",
                    logprob=float(chosen.logprob) if chosen is not None else -math.inf,
                    top=tuple((c.decoded_token or "", float(c.logprob)) for c in top),
                )
            )
        return tuple(out)


def prompt_logprobs(
    prompt_ids: list[int], entries: Any, top_logprobs: int
) -> tuple[TokenLogprob, ...]:
    """vLLM's ``RequestOutput.prompt_logprobs`` (one ``{token_id: Logprob}`` per prompt token,
    ``None`` for the first) as Meridian's: the first token gets logprob 0 and no alternatives
    (the edge shows ``null``), the others their own logprob and the top alternatives."""
    if not entries:
        return ()
    out: list[TokenLogprob] = []
    for token_id, candidates in zip(prompt_ids, entries, strict=False):
        if not candidates:
            out.append(TokenLogprob(token="", logprob=0.0))
            continue
        chosen = candidates.get(token_id)
        top = sorted((c for c in candidates.values() if c.rank is not None), key=lambda c: c.rank)[
            :top_logprobs
        ]
        out.append(
            TokenLogprob(
                token=(chosen.decoded_token or "") if chosen is not None else "",
                logprob=float(chosen.logprob) if chosen is not None else -math.inf,
                top=tuple((c.decoded_token or "", float(c.logprob)) for c in top),
            )
        )
    return tuple(out)


def _finish_reason(reason: str | None) -> FinishReason:
    if reason is None:
        # A finished output without a reason: the engine ended it without saying why.
        return FinishReason.ABORT
    mapped = _FINISH.get(str(reason))
    if mapped is None:
        raise InternalError(f"the engine failed the request (finish reason {reason!r})")
    return mapped


def _stamp(metrics: Any, name: str) -> float | None:
    """An engine-core timestamp in seconds, or None where vLLM has not set it (0.0)."""
    value = getattr(metrics, name, None) if metrics is not None else None
    if value is None or value <= 0.0:
        return None
    return float(value)
