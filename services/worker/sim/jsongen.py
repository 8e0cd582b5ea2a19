"""A small JSON-schema instance generator: deterministic values valid against a schema.

SimEngine's stand-in for structured outputs and tool-call arguments: what a real engine's
grammar-constrained decoding guarantees (output that validates), without a model. Values are
drawn from ``random.Random`` so one seed gives one document.

Covered (what OpenAI's structured outputs, pydantic and LangChain produce): ``type`` (one or a
list), ``enum``, ``const``, ``properties``/``required``/``additionalProperties``, ``items``
and ``prefixItems``, ``minItems``/``maxItems``, ``minimum``/``maximum`` (and the exclusive
forms), ``multipleOf`` for integers, ``minLength``/``maxLength``, ``format`` (date,
date-time, time, email, uuid, uri), ``anyOf``/``oneOf`` (the first branch), ``allOf``
(merged), ``$ref`` into ``$defs``/``definitions`` of the root (pydantic's nested models),
``default``, ``pattern`` (a match written from the parsed regex, :mod:`.regexgen`; a pattern
it cannot write for gets an ordinary string). Not covered: ``not``, ``if``/``then``. A
keyword whose value has the wrong JSON type (``"minLength": "x"``) is ignored, like an
unsupported keyword.

Recursive schemas (a pydantic ``Tree`` with ``children: list[Tree]``, a ``Chain`` with
``next: Chain | None``) end where the schema lets them. Down to :data:`MAX_DEPTH` nested
objects and arrays an instance is full; below it, minimal: objects take only their required
properties, arrays their ``minItems``, and an optional value (``anyOf`` with a null branch,
``"type": [..., "null"]``) is ``null``, so the instance still validates. Only a schema that
requires itself at every level (a required property whose schema is the object again) runs
on to :data:`CUT_DEPTH`, where it is cut to the smallest value of its type, which then fails
its ``required`` as no finite instance could pass.

Bounded work. A schema is client input, and the script is built synchronously on the
worker's event loop when the request is admitted, so a schema must not be able to buy more
work than the answer it asks for: ``minLength: 1e9``, ``minItems: 1e8``, ``minProperties``,
ten properties that each ``$ref`` the root (10^8 values at :data:`MAX_DEPTH`), an ``anyOf``
or ``allOf`` that includes itself. Every generation therefore runs under a :class:`Budget`
derived from the request's token budget:

- tokens: each value, separator and key is charged a lower bound of the tokens it will take
  (one per scalar, two quotes per string, one per comma and colon), so a spent budget means
  the text really is longer than ``max_tokens``;
- characters: :data:`CHARS_PER_TOKEN` per token, more than an ordinary token holds (12
  letters and a space), which bounds the one thing the token count cannot, a long string;
- schema work: dict entries copied while resolving ``$ref``/``anyOf``/``oneOf``/``allOf``
  (each schema node is resolved once and memoised) and ``uniqueItems`` repeats generated
  and thrown away, capped at :data:`MAX_SCHEMA_WORK` whatever the budget, since it buys no
  output.

When the budget runs out the instance stops growing where it is: a string is cut, a
container takes no more items. :func:`render` returns the JSON text up to that point, which
is a prefix of the document an unbounded generator would write (a cut ``uniqueItems`` array
may end in a separator where every further item would have been a repeat; its tokens up to
``max_tokens`` are the same), and says it is incomplete; the script streams it and finishes
with ``length``, as an engine does when ``max_tokens`` runs out mid-document. Out of schema
work the prefix can be short, even empty; it still ends with ``length``: unsupported schema
constructs are never refused here, so an unresolvable one is not either. Total work is
O(schema size + max_tokens).
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.worker.sim import regexgen

MAX_DEPTH = 8
"""Nested objects and arrays an instance is full down to; below, it is minimal."""
CUT_DEPTH = 32
"""Where a schema that requires itself at every level is cut (no finite instance exists)."""
MAX_REWRITES = 64
"""``$ref``/``anyOf``/``allOf`` rewrites of one schema node before it is taken as it stands:
a combinator that includes itself would otherwise recurse forever at the same depth."""
MAX_SCHEMA_WORK = 1_000_000
"""Dict entries copied while resolving a schema (tens of milliseconds): far above any real
schema (a pydantic model with a hundred nested models copies a few thousand)."""
WORK_PER_TOKEN = 50
"""Schema work one generated token is worth (a value costs about 50 dict-entry copies): what a
``uniqueItems`` repeat, generated and thrown away, is charged."""
CHARS_PER_TOKEN = 16
TOKEN_MARGIN = 2
"""Tokens generated beyond ``max_tokens``: the last piece of a cut prefix may be a partial
token, so the prefix runs a little past the budget and the first ``max_tokens`` are exact."""
DEFAULT_MAX_TOKENS = 1 << 16
"""The budget of :func:`generate` and of a script built without one: a fixed cap."""

_BISECT = 16
_BISECTIONS = 24
_PATTERN_TRIES: tuple[tuple[int | None, int | None], ...] = (
    ((None, None),) * 4
    + tuple((s, None) for s in range(_BISECT + 1))
    + tuple((None, spread) for spread in (2, 4, 8, 16, 32) for _ in range(8))
)
"""How a ``pattern`` with ``minLength``/``maxLength`` is met (``(stretch, spread)`` of
regexgen.match): four ordinary draws; every repeat stretched by 0, 1, 2… :data:`_BISECT`
beyond its minimum, then a bisection of the stretch up to the length limit (a match grows
with it: ``^[0-9a-f]+$`` of exactly 32 needs 31); then draws of ever wider spread, until the
length fits."""
_WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris")
_COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
_EMPTY: dict[str, Any] = {}
# Where the budget ran out. A truncated instance carries exactly one of these, the last
# thing generated; render() cuts the JSON text there. A NUL and a noncharacter: no real
# instance ends with them (a schema that forges one only makes its own answer shorter).
_CUT_VALUE = "\x00\ufdd0cut-value"  # stands for the item or key the budget did not reach
_CUT_STRING = "\x00\ufdd0cut-string"  # ends a string the budget cut short
_CUT_VALUE_JSON = json.dumps(_CUT_VALUE, ensure_ascii=False)  # cut before its opening quote
_CUT_STRING_JSON = json.dumps(_CUT_STRING, ensure_ascii=False)[1:]  # keep the string's quote


@dataclass(slots=True)
class Budget:
    """What one generation may still spend (see the module docstring); spent at zero."""

    tokens: int
    chars: int
    work: int = MAX_SCHEMA_WORK

    @classmethod
    def for_tokens(cls, max_tokens: int) -> Budget:
        tokens = max(1, max_tokens) + TOKEN_MARGIN
        return cls(tokens=tokens, chars=tokens * CHARS_PER_TOKEN)

    @property
    def spent(self) -> bool:
        return self.tokens <= 0 or self.chars <= 0 or self.work <= 0


@dataclass(frozen=True, slots=True)
class Rendering:
    """An instance as JSON text; when not ``complete``, the prefix the budget allowed."""

    text: str
    complete: bool


class InstanceTooLarge(ValueError):
    """The schema's instance does not fit the budget (only :func:`generate` raises it)."""


class SchemaGenerator:
    """Instances of one root schema (its ``$defs`` resolve ``$ref``), within ``budget``.

    ``truncated`` is set once the budget cut the instance short; the instance then holds one
    cut marker, at the place the text is to end (:func:`render`).
    """

    def __init__(
        self, root: dict[str, Any], rng: random.Random, budget: Budget | None = None
    ) -> None:
        self._root = root
        self._rng = rng
        self._budget = budget if budget is not None else Budget.for_tokens(DEFAULT_MAX_TOKENS)
        self.truncated = False
        # Memos keyed by id(); each entry keeps its key object alive, so no id is reused.
        self._normal: dict[int, tuple[dict[str, Any], dict[str, Any], Any]] = {}
        self._minimal: dict[int, tuple[dict[str, Any], dict[str, Any], Any]] = {}
        self._required: dict[int, tuple[dict[str, Any], tuple[str, ...]]] = {}
        self._sizes: dict[int, tuple[Any, int]] = {}
        self._patterns: dict[str, Any] = {}  # pattern -> its parse (None: cannot write one)

    def generate(self) -> Any:
        return self._value(self._root, 0)

    # -- dispatch -----------------------------------------------------------------------------

    def _value(self, schema: Any, depth: int) -> Any:
        if schema is True or not isinstance(schema, dict):
            return self._leaf(self._word())
        schema, kind = self._normalize(schema, minimal=depth >= MAX_DEPTH)
        if self._budget.spent:  # its key (or resolving its schema) used up the budget
            return self._cut()
        if "const" in schema:
            return self._leaf(schema["const"])
        enum = schema.get("enum")
        if enum:
            return self._leaf(self._rng.choice(enum if isinstance(enum, list) else list(enum)))
        if depth >= CUT_DEPTH:
            return self._leaf(_smallest(kind))
        make = _MAKERS.get(kind) if isinstance(kind, str) else None
        if make is None:
            return self._leaf(self._word())
        return make(self, schema, depth)

    def _normalize(self, schema: dict[str, Any], *, minimal: bool) -> tuple[dict[str, Any], Any]:
        """``schema`` with ``$ref``, ``anyOf``/``oneOf`` and ``allOf`` resolved at the top, and
        its type; computed once per schema node and mode (an array of a thousand items of one
        model resolves the model once). ``minimal`` takes the null branch or type where there
        is one, so an optional recursion ends."""
        memo = self._minimal if minimal else self._normal
        hit = memo.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1], hit[2]
        out = self._rewrite(schema, minimal=minimal)
        kind = out.get("type")
        if isinstance(kind, list):
            self._budget.work -= len(kind)
            if minimal and "null" in kind:
                kind = "null"
            else:
                kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
        if kind is None:
            kind = _infer_type(out)
        memo[id(schema)] = (schema, out, kind)
        return out, kind

    def _rewrite(self, schema: dict[str, Any], *, minimal: bool) -> dict[str, Any]:
        for _ in range(MAX_REWRITES):
            schema = self._resolve(schema)
            if "const" in schema or schema.get("enum"):
                return schema
            key = next((k for k in ("anyOf", "oneOf") if schema.get(k)), None)
            if key is not None:
                rest = _without(schema, key)
                options = schema[key] if isinstance(schema[key], list) else []
                branches = [self._resolve(b) for b in options if isinstance(b, dict)]
                # A full instance prefers a branch that is not null, so Optional fields carry
                # a value; a minimal one prefers null, then a scalar, so a recursion through
                # them ends (Expr = BinOp | int: the int).
                chosen = next((b for b in branches if (b.get("type") == "null") == minimal), None)
                if minimal and chosen is None:
                    chosen = next((b for b in branches if _scalar(b)), None)
                if chosen is None:
                    chosen = branches[0] if branches else {}
                schema = {**rest, **chosen}
                self._budget.work -= len(options) + len(rest) + len(chosen)
            elif schema.get("allOf"):
                merged = _without(schema, "allOf")
                parts = schema["allOf"] if isinstance(schema["allOf"], list) else []
                for part in parts:
                    if self._budget.spent:
                        break
                    if isinstance(part, dict):
                        merged = self._merge(merged, self._resolve(part))
                schema = merged
            else:
                return schema
            if self._budget.spent:
                break
        return {k: v for k, v in schema.items() if k not in _COMBINATORS}

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < MAX_DEPTH:
            ref = schema["$ref"]
            target: Any = self._root
            if isinstance(ref, str) and ref.startswith("#"):
                parts = ref.lstrip("#").strip("/").split("/")
                self._budget.work -= len(parts)
                for part in parts:
                    if not part:
                        continue
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target.get(part, {}) if isinstance(target, dict) else {}
            rest = _without(schema, "$ref")
            schema = {**(target if isinstance(target, dict) else {}), **rest}
            self._budget.work -= len(schema) + len(rest)
            seen += 1
        return schema

    def _merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = _merge(a, b)
        work = len(a) + len(b)
        for key in ("properties", "required"):
            if key in a and key in b:
                work += _len(a[key]) + _len(b[key])
        self._budget.work -= work
        return out

    def _names(self, schema: dict[str, Any]) -> tuple[str, ...]:
        """``required`` without repeats (and without non-names), once per normalised schema:
        an object instantiated a thousand times must not rescan a long list each time."""
        hit = self._required.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1]
        raw = schema.get("required", ())
        names: tuple[str, ...] = ()
        if isinstance(raw, list | tuple):
            names = tuple(dict.fromkeys(r for r in raw if isinstance(r, str)))
        self._budget.work -= _len(raw)
        self._required[id(schema)] = (schema, names)
        return names

    # -- the budget ---------------------------------------------------------------------------

    def _take(self, tokens: int, chars: int) -> None:
        self._budget.tokens -= tokens
        self._budget.chars -= chars

    def _leaf(self, value: Any) -> Any:
        """Charge a finished value that is not built here (a scalar, a ``const``, an ``enum``
        member, whatever its size) and return it."""
        if isinstance(value, str):
            self._take(2, len(value) + 2)
        elif value is None or isinstance(value, bool | int | float) or not value:
            self._take(1, 2)
        else:
            self._take(1, self._size(value))
        return value

    def _size(self, value: Any) -> int:
        hit = self._sizes.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        try:
            size = len(json.dumps(value, ensure_ascii=False))
        except (TypeError, ValueError):
            size = 1
        self._sizes[id(value)] = (value, size)
        return size

    def _key(self, name: Any, out: dict[str, Any]) -> None:
        if name not in out:
            self._take(3, (len(name) if isinstance(name, str) else 1) + 4)

    def _full(self, out: list[Any] | dict[str, Any]) -> bool:
        """Whether the budget is spent, so ``out`` takes nothing more. The first container to
        find it so (unless a string was cut first) marks the place its next item would go."""
        if not self._budget.spent:
            return False
        if not self.truncated:
            self.truncated = True
            if isinstance(out, list):
                out.append(_CUT_VALUE)
            else:
                out[_CUT_VALUE] = None
        return True

    def _cut(self) -> str:
        """A value the budget did not reach at all: its key spent the budget, or resolving
        its schema spent the schema work."""
        self.truncated = True
        return _CUT_VALUE

    # -- types --------------------------------------------------------------------------------

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            props = {}
        self._take(1, 1)  # the opening bracket; the closing one once it is written
        out: dict[str, Any] = {}
        extra = schema.get("additionalProperties", True)
        extra_schema = extra if isinstance(extra, dict) else _EMPTY
        # A minimal object (below MAX_DEPTH) skips the optional properties: only the
        # required loop below writes any.
        if depth < MAX_DEPTH:
            for name, sub in props.items():
                if self._full(out):
                    return out
                self._key(name, out)
                out[name] = self._value(sub, depth + 1)
        for name in self._names(schema):
            if name in out:
                continue
            if self._full(out):
                return out
            self._key(name, out)
            out[name] = self._value(props.get(name, extra_schema), depth + 1)
        minimum = _count(schema.get("minProperties"), 0)
        i = 0
        while len(out) < minimum and extra is not False:
            if self._full(out):
                return out
            self._key(f"key{i}", out)
            out[f"key{i}"] = self._value(extra_schema, depth + 1)
            i += 1
        self._take(1, 1)
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        if not isinstance(prefix, list):
            prefix = []
        minimal = depth >= MAX_DEPTH
        low = _count(schema.get("minItems"), len(prefix) if prefix or minimal else 1)
        high = _count(schema.get("maxItems"), max(low, 3))
        if minimal:
            count = max(0, low)
        else:
            count = self._rng.randint(min(low, high), high) if high >= low else low
        items = schema.get("items", _EMPTY)
        self._take(1, 1)  # the opening bracket; the closing one once it is written
        unique = bool(schema.get("uniqueItems"))
        seen: set[Any] = set()
        out: list[Any] = []
        for i in range(count):
            if self._full(out):
                return out
            sub = prefix[i] if i < len(prefix) else items if items is not False else _EMPTY
            tokens, chars = self._budget.tokens, self._budget.chars
            self._comma(out)
            value = self._value(sub, depth + 1)
            if unique and not self.truncated:
                # Repeats are dropped as they come (not afterwards), so a cut array is still
                # the prefix of the whole one; a repeat's output is refunded, its making
                # charged as schema work, or enum [1] with minItems 1e8 would loop 1e8 times.
                key = _equality_key(value)
                if key in seen:
                    spent = tokens - self._budget.tokens
                    self._budget.tokens, self._budget.chars = tokens, chars
                    self._budget.work -= WORK_PER_TOKEN * (1 + spent)
                    continue
                seen.add(key)
            out.append(value)
        if unique:
            while len(out) < low:  # unique values of a small enum may be too few: keep what fits
                if self._full(out):
                    return out
                self._comma(out)
                out.append(self._leaf(f"{self._word()}{len(out)}"))
        self._take(1, 1)
        return out

    def _comma(self, out: list[Any]) -> None:
        if out:
            self._take(1, 2)

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            matched = self._matching(pattern, schema)
            if matched is not None:
                return matched
        fmt = schema.get("format")
        value: str
        if fmt == "date":
            value = f"2026-{self._rng.randint(1, 12):02d}-{self._rng.randint(1, 28):02d}"
        elif fmt == "date-time":
            value = f"2026-{self._rng.randint(1, 12):02d}-{self._rng.randint(1, 28):02d}T12:00:00Z"
        elif fmt == "time":
            value = f"{self._rng.randint(0, 23):02d}:{self._rng.randint(0, 59):02d}:00Z"
        elif fmt == "email":
            value = f"{self._word()}@example.com"
        elif fmt == "uuid":
            value = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        elif fmt in ("uri", "url"):
            value = f"https://example.com/{self._word()}"
        else:
            value = " ".join(self._word() for _ in range(self._rng.randint(1, 3)))
        low = _count(schema.get("minLength"), 0)
        longest = _number_or_none(schema.get("maxLength"))
        high = max(0, int(longest)) if longest is not None else None
        # Pad to minLength in one go (never one character at a time), and only as far as
        # maxLength keeps and the budget allows.
        pad = max(0, low - len(value))
        if high is not None:
            pad = min(pad, max(0, high - len(value)))
        room = max(0, self._budget.chars - len(value) - 2)
        cut = pad > room
        value += "x" * min(pad, room)
        if high is not None:
            value = value[:high]
        # Quotes and content; a cut string's closing quote is never written.
        self._take((1 if value else 0) + (1 if cut else 2), len(value) + 2)
        if cut:
            self.truncated = True
            value += _CUT_STRING
        return value

    def _matching(self, pattern: str, schema: dict[str, Any]) -> str | None:
        """A string matching ``pattern`` within ``minLength``/``maxLength`` (see
        :data:`_PATTERN_TRIES`; then the last match whatever its length), charged; cut where
        the budget runs out; ``None`` when there is no match to write (the caller writes an
        ordinary string)."""
        if pattern not in self._patterns:
            self._budget.work -= len(pattern)
            self._patterns[pattern] = regexgen.parse(pattern)
        tree = self._patterns[pattern]
        if tree is None:
            return None
        low = _count(schema.get("minLength"), 0)
        longest = _number_or_none(schema.get("maxLength"))
        room = max(0, self._budget.chars - 2)
        limit = min(room, max(0, int(longest))) if longest is not None else room
        value: str | None = None
        cut = False

        def draw(stretch: int | None, spread: int | None) -> str:
            """One try: "fits", "short", "long" (over maxLength), "dead" (redraw), "cut" (the
            budget ran out: stop), "unsupported"."""
            nonlocal value, cut
            steps = max(1, min(regexgen.MAX_STEPS, self._budget.work))
            try:
                text, used = regexgen.match(tree, self._rng, limit, steps, stretch, spread)
            except regexgen.TooLong as err:
                self._budget.work -= err.steps
                if limit < room and err.steps <= steps:
                    return "long"  # maxLength bound it: another draw may be shorter
                value, cut = err.prefix, True  # the budget (or the work) bound it: cut there
                return "cut"
            except regexgen.DeadEnd as err:
                self._budget.work -= err.steps
                return "dead"
            except regexgen.Unsupported:
                return "unsupported"
            self._budget.work -= used
            value = text
            if self._budget.work <= 0:
                return "cut" if not text else "fits"
            return "fits" if len(text) >= low else "short"

        outcome = "short"
        for stretch, spread in _PATTERN_TRIES:
            outcome = draw(stretch, spread)
            if outcome in ("fits", "cut", "unsupported"):
                break
            if stretch == _BISECT:  # the linear sweep is over: bisect the stretch up to limit
                lo, hi = stretch, max(stretch, limit)
                for _ in range(_BISECTIONS):
                    if lo > hi:
                        break
                    mid = (lo + hi) // 2
                    outcome = draw(mid, None)
                    if outcome in ("fits", "cut", "unsupported"):
                        break
                    if outcome == "long":
                        hi = mid - 1
                    elif outcome == "short":
                        lo = mid + 1
                if outcome in ("fits", "cut", "unsupported"):
                    break
        if outcome == "unsupported":
            return None
        if value is None:
            return None
        if not cut and len(value) < low:
            value = _padded(tree, value, min(low, limit))
        self._take((1 if value else 0) + (1 if cut else 2), len(value) + 2)
        if cut:
            self.truncated = True
            value += _CUT_STRING
        return value

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low, high = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        value = self._rng.randint(low, high)
        if isinstance(step, int) and step > 0:
            value = (value // step) * step
            if value < low:
                value += step
        self._leaf(value)
        return value

    def _number(self, schema: dict[str, Any], depth: int) -> float | int:
        if isinstance(schema.get("multipleOf"), int):
            return self._integer(schema, depth)
        low, high = _bounds(schema, integer=False)
        value = round(self._rng.uniform(low, high), 3) if high > low else low
        if isinstance(value, float) and not math.isfinite(value):
            value = low  # a range as wide as the floats overflows to inf, which is not JSON
        self._leaf(value)
        return value

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        value = self._rng.random() < 0.5
        self._leaf(value)
        return value

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        self._leaf(None)

    def _word(self) -> str:
        return self._rng.choice(_WORDS)


_MAKERS: dict[str, Callable[[SchemaGenerator, dict[str, Any], int], Any]] = {
    "object": SchemaGenerator._object,
    "array": SchemaGenerator._array,
    "string": SchemaGenerator._string,
    "integer": SchemaGenerator._integer,
    "number": SchemaGenerator._number,
    "boolean": SchemaGenerator._boolean,
    "null": SchemaGenerator._null,
}
"""The types there is a generator for; an explicit table, so a ``type`` naming some other
method of the class (``"value"``) is just an unknown type."""


def render(schema: Any, seed: int, *, max_tokens: int) -> Rendering:
    """One instance of ``schema`` as JSON text (the same for the same seed), or, when it
    cannot be written within about ``max_tokens`` tokens, the prefix of it that can."""
    gen = SchemaGenerator(schema, random.Random(seed), Budget.for_tokens(max_tokens))
    text = json.dumps(gen.generate(), ensure_ascii=False)
    if not gen.truncated:
        return Rendering(text, complete=True)
    at = max(text.rfind(_CUT_VALUE_JSON), text.rfind(_CUT_STRING_JSON))
    return Rendering(text[:at] if at >= 0 else text, complete=False)


def generate(schema: dict[str, Any], seed: int, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> Any:
    """One instance of ``schema``, the same for the same seed. Raises
    :class:`InstanceTooLarge` when it does not fit ``max_tokens`` (:func:`render` gives the
    prefix that does)."""
    gen = SchemaGenerator(schema, random.Random(seed), Budget.for_tokens(max_tokens))
    value = gen.generate()
    if gen.truncated:
        raise InstanceTooLarge(f"the schema's instance is longer than {max_tokens} tokens")
    return value


def _count(value: Any, default: int) -> int:
    """A size keyword (``minLength``, ``maxItems``…) as an int; ``default`` when it is not a
    finite number (a string, a bool, NaN: ignored like any keyword this does not support)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, float) and not math.isfinite(value):
        return default
    return int(value)


def _number_or_none(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _bounds(schema: dict[str, Any], *, integer: bool) -> tuple[Any, Any]:
    minimum = _number_or_none(schema.get("minimum"))
    maximum = _number_or_none(schema.get("maximum"))
    low = minimum if minimum is not None else (0 if maximum is None else maximum - 100)
    high = maximum if maximum is not None else low + 100
    exclusive_min = _number_or_none(schema.get("exclusiveMinimum"))
    if exclusive_min is not None:
        low = max(low, exclusive_min + (1 if integer else 1e-3))
        high = max(high, low)
    exclusive_max = _number_or_none(schema.get("exclusiveMaximum"))
    if exclusive_max is not None:
        high = min(high, exclusive_max - (1 if integer else 1e-3))
    if integer:
        low, high = math.ceil(low), math.floor(high)
    if high < low:
        high = low
    return low, high


def _infer_type(schema: dict[str, Any]) -> str:
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if "minimum" in schema or "maximum" in schema:
        return "number"
    return "string"


def _padded(tree: Any, value: str, length: int) -> str:
    """``value`` (a match) padded to ``length`` where the pattern leaves an end open (a
    ``pattern`` is a search); as it is where both ends are anchored."""
    start, end = regexgen.open_ends(tree)
    pad = "x" * max(0, length - len(value))
    if end:
        return value + pad
    if start:
        return pad + value
    return value


def _scalar(schema: dict[str, Any]) -> bool:
    """Whether a resolved branch is a scalar (no object or array, no further combinator):
    one that ends a recursion."""
    if any(k in schema for k in _COMBINATORS):
        return False
    kind = schema.get("type")
    if kind is None:
        kind = _infer_type(schema)
    kinds = kind if isinstance(kind, list) else [kind]
    return bool(kinds) and all(k not in ("object", "array") for k in kinds)


def _smallest(kind: Any) -> Any:
    if not isinstance(kind, str):  # a "type" that is an object or a list of them
        return None
    return {"object": {}, "array": [], "string": "", "integer": 0, "number": 0}.get(kind)


def _without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != key}


def _len(value: Any) -> int:
    return len(value) if isinstance(value, list | tuple | dict | str) else 1


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _equality_key(value: Any) -> Any:
    """A hashable stand-in equal (and hashing equal) exactly when the JSON values are equal
    under ``==`` (objects regardless of key order, ``1 == 1.0 == True``), so ``uniqueItems``
    is a set lookup per item, not the pairwise ``v not in out`` scan it replaces."""
    if isinstance(value, dict):
        return ("object", frozenset((k, _equality_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_equality_key(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("unhashable", id(value))
    return ("scalar", value)
