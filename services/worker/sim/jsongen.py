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
``default``. Not covered: ``pattern`` (a string is generated regardless; the tests' schemas
avoid it), ``not``, ``if``/``then``, recursive ``$ref`` deeper than :data:`MAX_DEPTH` (the
deepest level is cut short with the smallest value its type allows).
"""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

MAX_DEPTH = 8
_WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris")


class SchemaGenerator:
    """Instances of one root schema (its ``$defs`` resolve ``$ref``)."""

    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def generate(self) -> Any:
        return self._value(self._root, 0)

    # -- dispatch -----------------------------------------------------------------------------

    def _value(self, schema: Any, depth: int) -> Any:
        if schema is True or not isinstance(schema, dict):
            return self._word()
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self._rng.choice(list(schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                branches = [self._resolve(b) for b in schema[key] if isinstance(b, dict)]
                # Prefer a branch that is not null, so Optional fields carry a value.
                chosen = next((b for b in branches if b.get("type") != "null"), branches[0])
                return self._value({**_without(schema, key), **chosen}, depth)
        if schema.get("allOf"):
            merged = _without(schema, "allOf")
            for part in schema["allOf"]:
                merged = _merge(merged, self._resolve(part))
            return self._value(merged, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
        if kind is None:
            kind = _infer_type(schema)
        if depth >= MAX_DEPTH:
            return _smallest(kind)
        make = getattr(self, f"_{kind}", None)
        return make(schema, depth) if make is not None else self._word()

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < MAX_DEPTH:
            ref = schema["$ref"]
            target: Any = self._root
            if isinstance(ref, str) and ref.startswith("#"):
                for part in ref.lstrip("#").strip("/").split("/"):
                    if not part:
                        continue
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target.get(part, {}) if isinstance(target, dict) else {}
            rest = _without(schema, "$ref")
            schema = {**(target if isinstance(target, dict) else {}), **rest}
            seen += 1
        return schema

    # -- types --------------------------------------------------------------------------------

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        out: dict[str, Any] = {}
        for name, sub in props.items():
            out[name] = self._value(sub, depth + 1)
        required = [r for r in schema.get("required", ()) if r not in out]
        extra = schema.get("additionalProperties", True)
        for name in required:
            out[name] = self._value(extra if isinstance(extra, dict) else {}, depth + 1)
        minimum = int(schema.get("minProperties", 0))
        i = 0
        while len(out) < minimum and extra is not False:
            out[f"key{i}"] = self._value(extra if isinstance(extra, dict) else {}, depth + 1)
            i += 1
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        low = int(schema.get("minItems", 1 if not prefix else len(prefix)))
        high = int(schema.get("maxItems", max(low, 3)))
        count = self._rng.randint(min(low, high), high) if high >= low else low
        items = schema.get("items", {})
        out = [self._value(prefix[i], depth + 1) for i in range(min(len(prefix), count))]
        while len(out) < count:
            out.append(self._value(items if items is not False else {}, depth + 1))
        if schema.get("uniqueItems"):
            out = _unique(out)
            while len(out) < low:  # unique values of a small enum may be too few: keep what fits
                out.append(f"{self._word()}{len(out)}")
        return out

    def _string(self, schema: dict[str, Any], depth: int) -> str:
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
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        while len(value) < low:
            value += "x"
        if high is not None:
            value = value[: int(high)]
        return value

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low, high = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        value = self._rng.randint(low, high)
        if isinstance(step, int) and step > 0:
            value = (value // step) * step
            if value < low:
                value += step
        return value

    def _number(self, schema: dict[str, Any], depth: int) -> float | int:
        if isinstance(schema.get("multipleOf"), int):
            return self._integer(schema, depth)
        low, high = _bounds(schema, integer=False)
        return round(self._rng.uniform(low, high), 3) if high > low else low

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        return self._rng.random() < 0.5

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        return None

    def _word(self) -> str:
        return self._rng.choice(_WORDS)


def generate(schema: dict[str, Any], seed: int) -> Any:
    """One instance of ``schema``, the same for the same seed."""
    return SchemaGenerator(schema, random.Random(seed)).generate()


def _bounds(schema: dict[str, Any], *, integer: bool) -> tuple[Any, Any]:
    low = schema.get("minimum", 0 if "maximum" not in schema else schema["maximum"] - 100)
    high = schema.get("maximum", low + 100)
    if "exclusiveMinimum" in schema and not isinstance(schema["exclusiveMinimum"], bool):
        low = max(low, schema["exclusiveMinimum"] + (1 if integer else 1e-3))
        high = max(high, low)
    if "exclusiveMaximum" in schema and not isinstance(schema["exclusiveMaximum"], bool):
        high = min(high, schema["exclusiveMaximum"] - (1 if integer else 1e-3))
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


def _smallest(kind: Any) -> Any:
    return {"object": {}, "array": [], "string": "", "integer": 0, "number": 0}.get(kind)


def _without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != key}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    if "required" in a and "required" in b:
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _unique(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
