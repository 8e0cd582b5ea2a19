"""A located reader for parsed YAML: every value knows its path, and every problem is collected
with it, so a bad scenario is reported whole (``events[2].at_s: must be >= 0``) instead of one
traceback at a time (the same contract as the router's ``profile.py``)."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 8, 8
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlong = 40


def _show(value: Any) -> str:
    """A value in an error message, cut short: a bad key's value may be a whole document."""
    return _SHORT.repr(value)


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


_MISSING = object()


class Node:
    """A value at a path. ``Node(problems, value, "events[2]")``."""

    __slots__ = ("path", "problems", "value")

    def __init__(self, problems: Problems, value: Any, path: str) -> None:
        self.problems = problems
        self.value = value
        self.path = path

    def fail(self, message: str) -> None:
        self.problems.add(self.path or "(document)", message)

    def _child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    # --- shape ---------------------------------------------------------------------------

    def mapping(self, known: Sequence[str]) -> bool:
        """True when this is a mapping whose keys are all in ``known`` (unknown keys are
        reported; a typo must not fall back to a default silently)."""
        if not isinstance(self.value, Mapping):
            self.fail("must be a mapping")
            return False
        for key in self.value:
            if key not in known:
                self.problems.add(
                    self._child_path(str(key)),
                    f"unknown key (expected one of: {', '.join(known)})",
                )
        return True

    def has(self, key: str) -> bool:
        return isinstance(self.value, Mapping) and key in self.value

    def get(self, key: str) -> Node:
        value = self.value.get(key, _MISSING) if isinstance(self.value, Mapping) else _MISSING
        return Node(self.problems, value, self._child_path(key))

    def items(self) -> Iterator[tuple[str, Node]]:
        if not isinstance(self.value, Mapping):
            self.fail("must be a mapping")
            return
        for key, value in self.value.items():
            yield str(key), Node(self.problems, value, self._child_path(str(key)))

    def elements(self) -> Iterator[Node]:
        if not isinstance(self.value, list):
            self.fail("must be a list")
            return
        for i, value in enumerate(self.value):
            yield Node(self.problems, value, f"{self.path}[{i}]")

    @property
    def missing(self) -> bool:
        return self.value is _MISSING

    # --- scalars -------------------------------------------------------------------------

    def number(
        self,
        default: float | None = None,
        *,
        lo: float = -math.inf,
        hi: float = math.inf,
        lo_open: bool = False,
    ) -> float:
        """A finite number within the bounds; required when ``default`` is None."""
        v = self.value
        if v is _MISSING:
            if default is None:
                self.fail("required")
                return lo if math.isfinite(lo) else 0.0
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            self.fail(f"must be a number, got {_show(v)}")
            return default if default is not None else 0.0
        if v < lo or (lo_open and v == lo) or v > hi:
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            rng = f"{bound} and <= {hi:g}" if math.isfinite(hi) else bound
            self.fail(f"must be {rng}, got {_show(v)}")  # the scenario is refused; the value is
            # clamped so that the rest of the check can go on computing with it
            return default if default is not None else min(max(float(v), lo), hi)
        return float(v)

    def integer(self, default: int | None = None, *, lo: int = 0, hi: int | None = None) -> int:
        v = self.value
        if v is _MISSING:
            if default is None:
                self.fail("required")
                return lo
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"must be an integer, got {_show(v)}")
            return default if default is not None else lo
        if v < lo or (hi is not None and v > hi):
            self.fail(
                f"must be >= {lo}" + (f" and <= {hi}" if hi is not None else "") + f", got {v}"
            )
            return default if default is not None else lo
        return v

    def string(self, default: str | None = None, *, choices: Sequence[str] = ()) -> str:
        v = self.value
        if v is _MISSING:
            if default is None:
                self.fail("required")
                return ""
            return default
        if not isinstance(v, str) or not v:
            self.fail(f"must be a non-empty string, got {_show(v)}")
            return default or ""
        if choices and v not in choices:
            self.fail(f"must be one of {', '.join(choices)}, got {_show(v)}")
            return default or choices[0]
        return v

    def strings(self) -> list[str]:
        """A string or a list of strings."""
        v = self.value
        if isinstance(v, str) and v:
            return [v]
        if isinstance(v, list) and all(isinstance(x, str) and x for x in v) and v:
            return list(v)
        self.fail(f"must be a string or a non-empty list of strings, got {_show(v)}")
        return []

    def boolean(self, default: bool) -> bool:
        v = self.value
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            self.fail(f"must be true or false, got {_show(v)}")
            return default
        return v
