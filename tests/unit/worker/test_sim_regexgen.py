"""SimEngine's ``pattern`` support (services/worker/sim/regexgen.py): what it writes matches
the pattern, what it cannot write for is said up front, and a hostile pattern costs bounded
work."""

from __future__ import annotations

import random
import re
from typing import Any

import jsonschema
import pytest

from services.worker.sim import jsongen, regexgen

PATTERNS = [
    r"^\d{3}-\d{4}$",
    r"^[A-Z]{2,4}\d*$",
    r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$",
    r"^\+?[1-9]\d{1,14}$",
    r"^#(?:[0-9a-fA-F]{3}){1,2}$",
    r"^(?:red|green|blue)(?:-(?:light|dark))?$",
    r"^[^\s@]+$",
    r"^(ab|cd)+\1$",
    r"^(?P<word>[a-z]+)-(?P=word)$",
    r"^\w+\.\W\S\D$",
    r"(?i)^hello[.!]?$",
    r"^[A-Z][a-z]+(?: [A-Z][a-z]+)*$",
    r"^v\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$",
    r"^[\d\-]+$",
    r"^.{3,5}$",
    r"^(?>ab|a)c$",
    r"ERR-\d+",  # unanchored: the match alone
    r"(?i)[^A]",  # a case-insensitive negation excludes both cases
    r"(?i)^[^a-z]+$",
    r"^[^\W\d]$",
    r"(a)|b\1",  # a backreference to a group the draw left out cannot match: drawn again
    r"^(a)?\1$",
    r"^(?:(a)|b)+\1$",
    r"^[\uD7FF-\uE000]{20}$",  # never a lone surrogate (not text: the worker cannot send it)
    r"^[\u0000-\uffff]{40}$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_written_string_matches_its_pattern(pattern: str) -> None:
    tree = regexgen.parse(pattern)
    assert tree is not None
    for seed in range(20):
        value = jsongen.generate({"type": "string", "pattern": pattern}, seed)
        assert re.fullmatch(pattern, value), (pattern, value)
        value.encode("utf-8")  # text a GenerateChunk can carry


@pytest.mark.parametrize(
    "pattern",
    [r"(?=a)a", r"(?!x)y", r"(?<=a)b", r"(a)?(?(1)b|c)", "((", "[z-a]", "a{99999999999}"],
)
def test_lookarounds_conditionals_and_bad_patterns_are_not_generated_from(pattern: str) -> None:
    assert regexgen.parse(pattern) is None


def test_a_pattern_it_cannot_write_for_gets_an_ordinary_string() -> None:
    value = jsongen.generate({"type": "string", "pattern": "(?=a)a"}, 1)
    assert isinstance(value, str)
    assert value


def test_a_match_longer_than_the_room_stops_with_its_prefix() -> None:
    tree = regexgen.parse("^(?:ab){1000000000}$")
    with pytest.raises(regexgen.TooLong) as long:
        regexgen.match(tree, random.Random(0), room=9)
    assert long.value.prefix == "ababababa"


def test_repeats_of_nothing_stop_at_the_step_limit() -> None:
    tree = regexgen.parse("(?:){1000000000}x")
    with pytest.raises(regexgen.TooLong) as endless:
        regexgen.match(tree, random.Random(0), room=100, max_steps=500)
    assert (endless.value.prefix, endless.value.steps) == ("", 501)


LENGTHS: list[dict[str, Any]] = [
    {"type": "string", "pattern": r"^[a-z]{1,20}$", "minLength": 15},
    {"type": "string", "pattern": r"^[a-z]+$", "maxLength": 2},
    {"type": "string", "pattern": r"^\d{2,9}$", "minLength": 5, "maxLength": 6},
    # An exact length on an open repeat: found by bisecting the stretch (31 for 32 here).
    {"type": "string", "pattern": r"^[0-9a-f]+$", "minLength": 32, "maxLength": 32},
    {"type": "string", "pattern": r"^[a-z]{2,64}$", "minLength": 30, "maxLength": 30},
    {"type": "string", "pattern": r"^[a-z]+$", "minLength": 900, "maxLength": 1000},
    # A pattern is a search: an open end is padded to minLength.
    {"type": "string", "pattern": r"^[A-Z]", "minLength": 3},
    {"type": "string", "pattern": r"[0-9]$", "minLength": 5},
    {"type": "string", "pattern": r"[0-9]", "minLength": 5, "maxLength": 5},
]


@pytest.mark.parametrize("schema", LENGTHS, ids=[str(i) for i in range(len(LENGTHS))])
@pytest.mark.parametrize("seed", range(6))
def test_a_pattern_with_length_bounds_keeps_both(schema: dict[str, Any], seed: int) -> None:
    value = jsongen.generate(schema, seed)
    jsonschema.validate(value, schema)


def test_patterned_fields_of_an_object_validate() -> None:
    schema = {
        "type": "object",
        "properties": {
            "zip": {"type": "string", "pattern": r"^\d{5}(?:-\d{4})?$"},
            "sku": {"type": "string", "pattern": r"^[A-Z]{3}-\d{3,6}$"},
            "tags": {"type": "array", "items": {"type": "string", "pattern": r"^#\w+$"}},
        },
        "required": ["zip", "sku", "tags"],
        "additionalProperties": False,
    }
    for seed in range(10):
        jsonschema.validate(jsongen.generate(schema, seed), schema)


def test_a_long_match_is_cut_by_max_tokens_like_any_long_string() -> None:
    rendering = jsongen.render({"type": "string", "pattern": "^a{5000}$"}, 1, max_tokens=10)
    assert not rendering.complete
    assert rendering.text.startswith('"aaa')
    assert not rendering.text.endswith('"')


@pytest.mark.timeout(30, method="signal")  # it took 87 s when each character rescanned them
def test_a_negated_class_of_thousands_of_items_is_prepared_once() -> None:
    # 3,000 excluded characters, 100 strings of 30: each drawn character must not rescan them.
    excluded = "".join(chr(0x100 + i) for i in range(3000))
    pattern = f"^[^{excluded}]{{30}}$"
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 100,
        "items": {"type": "string", "pattern": pattern},
    }
    value = jsongen.generate(schema, 0)
    assert len(value) == 100
    assert all(re.fullmatch(pattern, v) for v in value)
