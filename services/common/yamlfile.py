"""YAML from a stranger's file, bounded: every config, profile and scenario is read here.

``yaml.safe_load`` builds no objects but plain data, yet two inputs still break a process that
trusts it: a document nested past Python's recursion limit (``[[[[…``, 100 KB of it) ends in a
``RecursionError`` traceback instead of a located error, and an alias "bomb" (nine anchors
each listing the previous one nine times: 1 KB of text) is a few hundred objects in memory but
387 million values to anything that walks or prints it — the validators do both. Both come
back as :class:`YamlTooComplex`, a ``yaml.YAMLError``, so every caller's existing "invalid
YAML" handling names the file.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 1_000_000
"""Values a document may expand to, aliases counted each time they are used (the largest
shipped document, the planet scenario, is a few thousand)."""


class YamlTooComplex(yaml.YAMLError):
    """Nested too deeply, or expanding to too many values through aliases."""


def safe_load(text: str, *, max_values: int = MAX_VALUES) -> Any:
    """``yaml.safe_load``, refusing documents nested too deeply or too large once expanded."""
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise YamlTooComplex("the document is nested too deeply") from None
    _check_expanded_size(data, max_values)
    return data


def _check_expanded_size(data: Any, limit: int) -> None:
    """Walk the document as a validator would (an alias's target once per use), stopping at
    ``limit`` values: bounded time whatever the aliases would expand to."""
    seen = 0
    stack = [data]
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            raise YamlTooComplex(
                f"the document expands to more than {limit:,} values (through aliases: "
                "'&name' anchors used with '*name')"
            )
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
