"""One request inside the simulator: its tokens, KV blocks, text and finish rules.

The scheduler decides *when* a sequence computes tokens; this module decides *what* a new token
is and whether the sequence is done, and renders the :class:`EngineOutput` the caller sees:

- finish rules, in vLLM's order: a stop string ends the text before the stop string
  (``stop``), but not one that ends within the first ``min_tokens`` tokens' text; the
  natural length drawn from the seed ends it (``stop``, unless ``ignore_eos``), and so does
  a token of ``stop_token_ids``, but neither within the first ``min_tokens`` tokens (vLLM
  masks them there: a natural end that falls earlier comes at ``min_tokens + 1``);
  ``max_tokens`` ends it (``length``); so does reaching ``max_model_len`` (``length``);
- while a stop string could still be completing, its possible beginning is held back (the last
  ``len(longest stop) - 1`` characters), so a stop string never leaks into the stream;
- usage is cumulative in every output; ``queue_ms`` (arrival to first scheduled) and
  ``prefill_ms`` (first scheduled to first token) ride on the first output, and the last one
  carries those and ``decode_ms`` (first token to last token).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.worker.engine import EngineOutput, FinishReason, TokenLogprob, ToolCallDelta
from services.worker.sim.kv import block_hashes
from services.worker.sim.script import Script
from services.worker.sim.text import TextGenerator, token_id


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True, kw_only=True)
class SimSequence:
    request_id: str
    priority: int
    arrival: float
    order: int
    """Arrival order: FIFO tie-break within a priority, and preemption picks the largest."""
    prompt_ids: list[int]
    max_tokens: int
    natural_len: int | None
    stop: tuple[str, ...]
    max_model_len: int
    generator: TextGenerator
    logprobs: bool = False
    top_logprobs: int = 0
    script: Script | None = None
    """Tools / structured output: the answer decided up front (services/worker/sim/script.py)."""
    min_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    dropped_messages: int = 0
    """``truncate_oldest``: the oldest messages left out of the prompt to fit the context."""

    state: SeqState = SeqState.WAITING
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    registered: int = 0
    cached_prompt_tokens: int | None = None
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_output_sent: bool = False
    finish_reason: FinishReason | None = None
    preemptions: int = 0
    calls_started: set[int] = field(default_factory=set)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens to compute before the next token can be sampled."""
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to compute: a decode step, not a prefill."""
        return self.remaining == 1 and bool(self.output_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def full_block_hashes(self, block_size: int) -> list[int]:
        """Hashes of all full blocks of the current tokens, extending the memo incrementally."""
        full = self.num_tokens // block_size
        if len(self.hashes) < full:
            parent = self.hashes[-1] if self.hashes else None
            self.hashes.extend(
                block_hashes(self.token_ids(), block_size, start=len(self.hashes), parent=parent)
            )
        return self.hashes[:full]

    def reset_for_recompute(self) -> None:
        """Preempted: its KV is gone; it will prefill prompt and output again."""
        self.state = SeqState.WAITING
        self.num_computed = 0
        self.blocks = []
        self.registered = 0
        self.preemptions += 1

    def append_token(self, now: float) -> EngineOutput:
        """Sample the next token at ``now`` and return the output to stream."""
        tid, calls, lp = self._next_token()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        return self._output(now, token_ids=(tid,), logprobs=lp, tool_calls=calls)

    def replay_token(self) -> int:
        """Sample the next token exactly as :meth:`append_token` does — generator, script,
        logprob stream, text and finish rule — without streaming it; returns its id. A
        migrated stream's delivered tokens are replayed so (services/worker/sim/validation.py):
        the continuation is then the uninterrupted stream's, and a stream that had already
        ended is known to have (``finish_reason`` is set)."""
        return self._next_token()[0]

    def _next_token(self) -> tuple[int, tuple[ToolCallDelta, ...], tuple[TokenLogprob, ...]]:
        calls: tuple[ToolCallDelta, ...] = ()
        script = self.script
        if script is not None:
            step = script.next()
            piece = step.piece
            if step.call is not None:
                first = step.call not in self.calls_started
                self.calls_started.add(step.call)
                calls = (script.delta(step, first_of_call=first),)
        else:
            piece = self.generator.next_piece()
        tid = token_id(piece)
        self.output_ids.append(tid)
        before = len(self.text)
        if not calls:
            self.text += piece
        lp: tuple[TokenLogprob, ...] = ()
        if self.logprobs:
            value, top = self.generator.logprobs(piece, self.top_logprobs)
            lp = (TokenLogprob(token=piece, logprob=value, top=top),)
        self.finish_reason = self._finish_rule(tid, before, text_piece=not calls)
        return tid, calls, lp

    def _finish_rule(self, tid: int, before: int, *, text_piece: bool) -> FinishReason | None:
        """Why the sequence ends with the token just appended (``tid``; the text was
        ``before`` characters long without it), or None. vLLM's rules, in its order
        (``check_stop`` in vllm/v1/core/sched/utils.py): end-of-sequence or a stop token
        first, then the length limits. vLLM masks end-of-sequence and ``stop_token_ids``
        until ``min_tokens`` tokens are out (MinTokensLogitsProcessor), so neither can be the
        token at position ``min_tokens`` or before: a natural end that falls earlier comes
        right after, and with ``min_tokens == max_tokens`` the stream always ends on the
        limit (``length``). Only a natural end (or stop token) sampled at the very step that
        reaches ``max_tokens`` makes that step ``stop``."""
        produced = len(self.output_ids)
        script = self.script
        if script is not None and produced >= len(script):
            return script.finish
        # Stop strings too wait for min_tokens (vLLM's detokenizer checks them only past
        # it, in the text after the min_tokens-th token: one token per step here).
        if text_piece and produced > self.min_tokens and self._cut_at_stop_string(before):
            return FinishReason.STOP
        if produced > self.min_tokens and (
            (self.natural_len is not None and produced >= self.natural_len)
            or tid in self.stop_token_ids
        ):
            return FinishReason.STOP
        if produced >= self.max_tokens or self.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def abort_output(self, now: float) -> EngineOutput:
        """The final output of a request aborted at ``now``."""
        self.finish_reason = FinishReason.ABORT
        return self._output(now, token_ids=(), logprobs=(), tool_calls=())

    def _cut_at_stop_string(self, before: int) -> bool:
        """Truncate ``text`` at the earliest stop string that ends in the new piece."""
        if not self.stop:
            return False
        longest = max(len(s) for s in self.stop)
        start = max(0, before - longest + 1)
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if not found:
            return False
        self.text = self.text[: min(found)]
        return True

    def _output(
        self,
        now: float,
        *,
        token_ids: tuple[int, ...],
        logprobs: tuple[TokenLogprob, ...],
        tool_calls: tuple[ToolCallDelta, ...],
    ) -> EngineOutput:
        final = self.finish_reason is not None
        if final or not self.stop:
            end = len(self.text)
        else:
            end = max(self.emitted, len(self.text) - (max(len(s) for s in self.stop) - 1))
        delta = self.text[self.emitted : end]
        self.emitted = end
        out = EngineOutput(
            text=delta,
            token_ids=token_ids,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output_ids),
            cached_prompt_tokens=self.cached_prompt_tokens or 0,
            logprobs=logprobs,
            tool_calls=tool_calls,
        )
        if not self.first_output_sent or final:
            scheduled = self.first_scheduled_at
            out.queue_ms = _ms(self.arrival, now if scheduled is None else scheduled)
            if scheduled is not None and self.first_token_at is not None:
                out.prefill_ms = _ms(scheduled, self.first_token_at)
            self.first_output_sent = True
        if final and self.first_token_at is not None:
            last = now if self.last_token_at is None else self.last_token_at
            out.decode_ms = _ms(self.first_token_at, last)
        return out


def _ms(start: float, end: float) -> float:
    return max(0.0, (end - start) * 1000.0)
