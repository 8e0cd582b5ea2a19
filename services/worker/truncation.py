"""Dropping the oldest turns of a conversation until its prompt fits the model's context.

This is the Responses API's ``truncation: "auto"`` (``GenerateRequest.truncate_oldest``):
"if the input exceeds the model's context window, the oldest items of the conversation are
dropped". It is done here, in the worker, because only the engine can count a prompt: the
tokens a conversation takes depend on the model's tokenizer and chat template, which the edge
does not have.

What is kept: the leading system and developer messages (the instructions), then the longest
run of the newest messages whose prompt fits. The run starts at a ``user`` message when it can:
many chat templates (Llama 2's, Mistral's, Gemma's) refuse a conversation whose first turn is
the assistant's. Only when even the last user message and what follows it do not fit (an agent
loop of calls and outputs after one question) does it start later, at an assistant message —
never at a ``tool`` message, so a tool output is not shown without the call it answers. At
least the last turn is kept (the last call and its outputs, when the conversation ends with
tool outputs): when even that does not fit, the engine refuses the request as it would without
truncation, for the messages it kept.

Room is kept for the answer: ``max_tokens`` when the request sets it, else a quarter of the
context (at most 4,096 tokens) — so a conversation that would just fit is still cut when the
answer would have no room.

The kept run is found by bisection over the possible starts: the prompt's length only shrinks
as older messages are dropped, so ~log2(messages) renders find the fewest to drop. A
conversation that fits is measured once, as without truncation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.worker.engine import ChatTurn

#: Roles kept at the head of the conversation whatever is dropped after them.
INSTRUCTION_ROLES = frozenset({"system", "developer"})

Measured = TypeVar("Measured")


@dataclass(frozen=True, slots=True)
class Fitted(Generic[Measured]):
    """The conversation to render, what measuring it gave (the prompt's token ids), and how
    many messages were dropped to get there (0: it fitted as it was)."""

    messages: tuple[ChatTurn, ...]
    measured: Measured
    dropped: int


#: With ``max_tokens`` unset, the room truncation keeps for the answer: this share of the
#: context, at most ``ANSWER_ROOM_MAX`` tokens. Without it the kept prompt could fill the
#: context to its last token, and the answer would stop after one.
ANSWER_ROOM_SHARE = 4
ANSWER_ROOM_MAX = 4096


def max_prompt_tokens(max_model_len: int, max_tokens: int | None) -> int:
    """The longest prompt truncation keeps: room for ``max_tokens`` beside it, or, when it is
    unset, for a quarter of the context (at most 4,096 tokens)."""
    room = max_tokens or min(max_model_len // ANSWER_ROOM_SHARE, ANSWER_ROOM_MAX)
    return max_model_len - max(room, 1)


def cuts(messages: Sequence[ChatTurn]) -> tuple[int, list[int], list[int]]:
    """The instructions' length, then where the kept run may start, oldest first, in the two
    orders of preference: "drop nothing" and every later ``user`` message; then every message
    after the last of those that is neither a user's (already tried) nor a tool output."""
    head = 0
    while head < len(messages) and messages[head].role in INSTRUCTION_ROLES:
        head += 1
    users = [head] + [i for i in range(head + 1, len(messages)) if messages[i].role == "user"]
    later = [i for i in range(users[-1] + 1, len(messages)) if messages[i].role == "assistant"]
    return head, users, later


class Bisection(Generic[Measured]):
    """The search over one list of starts, apart from how a conversation is measured (a local
    render, or an upstream server's ``/tokenize``): ask :meth:`candidate` what to measure next,
    tell :meth:`record` what that gave, until :meth:`candidate` says None; then :meth:`result`.

    ``starts[lo]`` is known not to fit (``lo`` = 0, measured before the search: ``failed``),
    ``starts[hi]`` is the best start known to fit, if any yet."""

    def __init__(
        self,
        messages: tuple[ChatTurn, ...],
        head: int,
        starts: list[int],
        failed: Measured,
        fits: Callable[[Measured], bool],
    ) -> None:
        self._messages, self._head, self._starts, self._fits = messages, head, starts, fits
        self._lo, self._hi = 0, len(starts)
        self._failed = failed
        self._best: Measured | None = None
        self._mid = 0

    def _keep(self, start: int) -> tuple[ChatTurn, ...]:
        return self._messages[: self._head] + self._messages[start:]

    def candidate(self) -> tuple[ChatTurn, ...] | None:
        if self._hi - self._lo <= 1:
            return None
        self._mid = (self._lo + self._hi) // 2
        return self._keep(self._starts[self._mid])

    def record(self, measured: Measured) -> None:
        if self._fits(measured):
            self._hi, self._best = self._mid, measured
        else:
            self._lo, self._failed = self._mid, measured

    def result(self) -> tuple[Fitted[Measured], bool]:
        """The best kept run and whether it fits (if not: the shortest, lo the last start)."""
        fitted = self._best is not None
        start = self._starts[self._hi] if fitted else self._starts[self._lo]
        measured = self._best if self._best is not None else self._failed
        return Fitted(self._keep(start), measured, start - self._head), fitted


def _searches(
    messages: tuple[ChatTurn, ...], measured: Measured, fits: Callable[[Measured], bool]
) -> Iterator[Bisection[Measured]]:
    """The user-message starts' search, then — only while nothing has fitted — the search of
    the later assistant starts, from the shortest run the first one measured."""
    head, users, later = cuts(messages)
    first = Bisection(messages, head, users, measured, fits)
    yield first
    best, fitted = first.result()
    if not fitted and later:
        yield Bisection(messages, head, [users[-1], *later], best.measured, fits)


def fit_oldest(
    messages: Sequence[ChatTurn],
    measure: Callable[[tuple[ChatTurn, ...]], Measured],
    fits: Callable[[Measured], bool],
    *,
    measured: Measured | None = None,
) -> Fitted[Measured]:
    """The conversation with the fewest oldest messages dropped whose ``measure`` ``fits``.

    ``measure`` renders a conversation (to its prompt token ids, say); ``fits`` says whether
    that is short enough. ``measured``: what ``measure(messages)`` already gave, when the
    caller has it (it is not measured again). When nothing fits, the shortest conversation
    there is — the instructions and the last turn — with its measure: the caller's own check
    then refuses it, naming what it kept."""
    whole = tuple(messages)
    first = measure(whole) if measured is None else measured
    if fits(first):
        return Fitted(whole, first, 0)
    for search in _searches(whole, first, fits):
        while (kept := search.candidate()) is not None:
            search.record(measure(kept))
    return search.result()[0]


async def fit_oldest_async(
    messages: Sequence[ChatTurn],
    measure: Callable[[tuple[ChatTurn, ...]], Awaitable[Measured]],
    fits: Callable[[Measured], bool],
    *,
    measured: Measured,
) -> Fitted[Measured]:
    """:func:`fit_oldest` with a measure that is a call (an upstream server's tokenizer),
    for a conversation already measured (``measured``)."""
    whole = tuple(messages)
    if fits(measured):
        return Fitted(whole, measured, 0)
    for search in _searches(whole, measured, fits):
        while (kept := search.candidate()) is not None:
            search.record(await measure(kept))
    return search.result()[0]
