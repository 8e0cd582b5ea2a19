"""Strings that match a JSON-schema ``pattern``: SimEngine's stand-in for a grammar engine's
regex-constrained decoding (vLLM compiles ``pattern`` into the structured-output grammar).

A pattern is walked as Python's own regex parser reads it (``re._parser``, what
``re.compile`` uses; JSON schema's ECMA-262 dialect agrees with it on what schemas write:
classes, ranges, ``\\d``/``\\w``/``\\s``, groups, alternation, counted and open repeats,
anchors, backreferences) and one match is written out, choosing with the caller's
``random.Random``. The string is correct by construction, never checked with ``re.search``:
the pattern is client input, and matching a stranger's pattern is how a regex backtracks for
hours (ReDoS); generating is linear in what is written.

Not covered, so :func:`parse` gives ``None`` (or :func:`match` raises :class:`Unsupported`)
and the caller writes an ordinary string: a pattern that does not parse, lookahead and
lookbehind, conditionals (``(?(1)a|b)``), a class that excludes every printable character.
Open repeats (``*``, ``+``, ``{n,}``) take up to :data:`OPEN_REPEAT_EXTRA` more than their
minimum, counted ones (``{2,64}``) up to :data:`COUNTED_REPEAT_EXTRA` more. Bounded work: at
most ``room`` characters are written and ``max_steps`` parse nodes visited
(``(){1000000000}`` writes nothing a billion times); past either, :class:`TooLong` says how
far it got.
"""

from __future__ import annotations

import bisect
import importlib
import random
import re
import string
from collections.abc import Iterator
from typing import Any

OPEN_REPEAT_EXTRA = 3
COUNTED_REPEAT_EXTRA = 8
MAX_STEPS = 10_000
"""Parse nodes one match may visit (a few milliseconds); a real pattern's match visits tens."""

try:  # the regex parser re.compile itself uses; private, so it may one day be gone
    _parser: Any = importlib.import_module("re._parser")
    _c: Any = importlib.import_module("re._constants")
except ImportError:  # pragma: no cover - every CPython 3.11-3.13 has it
    _parser = _c = None

_DIGITS = string.digits
_WORD = string.ascii_letters + string.digits + "_"
_SPACE = " "
_PRINTABLE = string.ascii_letters + string.digits + " _-.@:/"
# What a negated class or category may draw from: ordinary printable ASCII.
_CATEGORIES: dict[str, tuple[str, bool]] = {
    "CATEGORY_DIGIT": (_DIGITS, False),
    "CATEGORY_NOT_DIGIT": (_DIGITS, True),
    "CATEGORY_WORD": (_WORD, False),
    "CATEGORY_NOT_WORD": (_WORD, True),
    "CATEGORY_SPACE": (" \t\n\r\f\v", False),
    "CATEGORY_NOT_SPACE": (" \t\n\r\f\v", True),
}
_UNSUPPORTED = {"ASSERT", "ASSERT_NOT", "GROUPREF_EXISTS"}
_PRINTABLE_SORTED = "".join(sorted(_PRINTABLE))
_CODES = [ord(ch) for ch in _PRINTABLE_SORTED]
_SURROGATES = (0xD800, 0xDFFF)
_ALLOWED = "ALLOWED"  # a negated class's items once prepared: (_ALLOWED, its characters)


class Unsupported(ValueError):
    """The pattern uses something this cannot write a match for."""


class DeadEnd(ValueError):
    """This draw took a path that cannot match (a backreference to a group the draw left
    out, as in ``(a)|b\\1``): draw again. ``steps``: the nodes it visited."""

    def __init__(self, steps: int) -> None:
        super().__init__("this draw cannot match")
        self.steps = steps


class TooLong(ValueError):
    """The match would be longer than ``room`` (or take more than ``max_steps``);
    ``prefix`` is what was written, ``steps`` the nodes visited."""

    def __init__(self, prefix: str, steps: int) -> None:
        super().__init__("the pattern's match does not fit")
        self.prefix = prefix
        self.steps = steps


def parse(pattern: str) -> Any | None:
    """The parsed pattern, or ``None`` when it cannot be generated from (bad or unsupported):
    parse once per schema, write many matches."""
    if _parser is None:
        return None
    try:
        tree = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):  # bad, deep, huge counts
        return None
    try:
        return tree if _prepare(tree) else None
    except Unsupported:
        return None


def match(
    tree: Any,
    rng: random.Random,
    room: int,
    max_steps: int = MAX_STEPS,
    stretch: int | None = None,
    spread: int | None = None,
) -> tuple[str, int]:
    """One string matching the parsed pattern ``tree``, at most ``room`` characters, and the
    parse nodes visited writing it (the caller charges them as work); raises :class:`TooLong`
    (with the prefix) when no match this writes fits.

    Repeats draw their count at random, up to ``spread`` beyond their minimum (by default
    :data:`OPEN_REPEAT_EXTRA` or :data:`COUNTED_REPEAT_EXTRA`); with ``stretch``, every repeat
    takes exactly its minimum plus ``stretch`` (as far as its maximum allows). A caller that
    needs a length (``minLength``, ``maxLength``) sweeps both."""
    writer = _Writer(rng, room, max_steps, stretch, spread)
    try:
        writer.emit(tree)
    except RecursionError as err:  # hundreds of nested groups
        raise Unsupported("the pattern nests too deeply") from err
    return "".join(writer.out), writer.steps


def _prepare(tree: Any) -> bool:
    """Whether ``tree`` is one this can write for; each negated class's allowed characters
    are computed here, once per parse, in place of its items (a class is drawn from once per
    character written, and a class of thousands of items must not be rescanned each time)."""
    for name, av in _nodes(tree):
        if name in _UNSUPPORTED:
            return False
        if name == "IN" and av and str(av[0][0]) == "NEGATE":
            av[:] = [(_ALLOWED, _allowed(av[1:]))]
    return True


def _nodes(tree: Any) -> Iterator[tuple[str, Any]]:
    """Every node of a parsed pattern, as (op name, argument), containers' bodies too."""
    stack = [tree]
    while stack:
        for op, av in stack.pop():
            name = str(op)
            yield name, av
            if name == "BRANCH":
                stack.extend(av[1])
            elif name == "SUBPATTERN":
                stack.append(av[3])
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                stack.append(av[2])
            elif name == "ATOMIC_GROUP":
                stack.append(av)


def open_ends(tree: Any) -> tuple[bool, bool]:
    """Whether a match of ``tree`` stays a match with characters added before it, and after
    it: JSON schema's ``pattern`` is a search, so ``^[A-Z]`` with ``minLength: 3`` is met by
    ``"Uxx"``. An end is open when no anchor could hold it (``^`` or ``\\A`` close the start,
    ``$`` or ``\\Z`` the end; ``\\b`` and ``\\B`` close both)."""
    start = end = True
    for name, av in _nodes(tree):
        if name != "AT":
            continue
        where = str(av)
        if where in ("AT_BEGINNING", "AT_BEGINNING_STRING", "AT_BEGINNING_LINE"):
            start = False
        elif where in ("AT_END", "AT_END_STRING", "AT_END_LINE"):
            end = False
        else:
            start = end = False
    return start, end


class _Writer:
    def __init__(
        self,
        rng: random.Random,
        room: int,
        max_steps: int,
        stretch: int | None,
        spread: int | None,
    ) -> None:
        self.rng = rng
        self.stretch = stretch
        self.spread = spread
        self.room = room
        self.max_steps = max_steps
        self.out: list[str] = []
        self.length = 0
        self.steps = 0
        self.groups: dict[int, str] = {}

    def put(self, text: str) -> None:
        if self.length + len(text) > self.room:
            self.out.append(text[: self.room - self.length])
            raise TooLong("".join(self.out), self.steps)
        self.out.append(text)
        self.length += len(text)

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise TooLong("".join(self.out), self.steps)

    def emit(self, tree: Any) -> None:
        for op, av in tree:
            self.step()
            name = str(op)
            if name == "LITERAL":
                self.put(_char(av))
            elif name == "NOT_LITERAL":  # either case excluded, whatever the flags say
                self.put(next(ch for ch in _PRINTABLE if ch.lower() != chr(av).lower()))
            elif name == "ANY":
                self.put(self.rng.choice(string.ascii_letters))
            elif name == "IN":
                self.put(self._from_class(av))
            elif name == "BRANCH":
                self.emit(self.rng.choice(av[1]))
            elif name == "SUBPATTERN":
                group, _, _, sub = av
                start = len(self.out)
                self.emit(sub)
                if group is not None:
                    self.groups[group] = "".join(self.out[start:])
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = av
                if self.stretch is not None:
                    count = min(high, low + self.stretch)
                else:
                    open_ = high == _c.MAXREPEAT
                    extra = OPEN_REPEAT_EXTRA if open_ else COUNTED_REPEAT_EXTRA
                    extra = self.spread if self.spread is not None else extra
                    count = self.rng.randint(low, max(low, min(high, low + extra)))
                for _ in range(count):
                    self.step()  # an empty body ((?:){1000000000}) visits no node
                    self.emit(sub)
            elif name == "ATOMIC_GROUP":
                self.emit(av)
            elif name == "GROUPREF":
                if av not in self.groups:
                    raise DeadEnd(self.steps)  # group av is not part of this draw
                self.put(self.groups[av])
            elif name == "AT":
                continue  # anchors: the match is the whole string, so ^ and $ hold
            else:
                raise Unsupported(name)

    def _from_class(self, items: list[tuple[Any, Any]]) -> str:
        if items and items[0][0] == _ALLOWED:  # a negated class, prepared by _prepare
            allowed: str = items[0][1]
            return self.rng.choice(allowed)
        op, av = self.rng.choice(items)
        name = str(op)
        if name == "LITERAL":
            return _char(av)
        if name == "RANGE":
            low, high = av
            code = self.rng.randint(low, high)
            if _SURROGATES[0] <= code <= _SURROGATES[1]:  # not text: draw outside the gap
                if low < _SURROGATES[0]:
                    code = self.rng.randint(low, _SURROGATES[0] - 1)
                elif high > _SURROGATES[1]:
                    code = self.rng.randint(_SURROGATES[1] + 1, high)
                else:
                    raise Unsupported("a range of surrogates only")
            return chr(code)
        if name == "CATEGORY":
            chars, negated = _CATEGORIES.get(str(av), (_WORD, False))
            if negated:
                return self.rng.choice([ch for ch in _PRINTABLE if ch not in chars])
            return self.rng.choice(chars if chars != " \t\n\r\f\v" else _SPACE)
        raise Unsupported(name)


def _char(code: int) -> str:
    """A literal's character; a lone surrogate is no text (it cannot be encoded as UTF-8)."""
    if _SURROGATES[0] <= code <= _SURROGATES[1]:
        raise Unsupported("a lone surrogate")
    return chr(code)


def _allowed(items: list[tuple[Any, Any]]) -> str:
    """The printable characters a negated class with ``items`` admits, in either case (so
    ``(?i)[^a]`` never draws ``A``, whatever the flags): one pass over the items."""
    excluded: set[str] = set()
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            excluded.add(chr(av))
        elif name == "RANGE":
            low, high = av
            excluded.update(
                _PRINTABLE_SORTED[
                    bisect.bisect_left(_CODES, low) : bisect.bisect_right(_CODES, high)
                ]
            )
        elif name == "CATEGORY":
            chars, negated = _CATEGORIES.get(str(av), (_WORD, False))
            excluded.update(ch for ch in _PRINTABLE if (ch in chars) != negated)
        else:
            raise Unsupported(name)
        if len(excluded) >= len(_PRINTABLE):
            break
    allowed = "".join(
        ch for ch in _PRINTABLE if ch not in excluded and ch.swapcase() not in excluded
    )
    if not allowed:
        raise Unsupported("a negated class that excludes every printable character")
    return allowed
