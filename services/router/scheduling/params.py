"""Reading and validating a plugin's parameters from a profile.

A plugin's ``from_params`` reads each parameter through :class:`Params` (type-checked, with a
default); its constructor checks ranges with :func:`require`. Both raise :class:`ParamError`
naming the parameter, which the profile loader prefixes with the plugin's location::

    profiles[default].scorers[0].params.tau_ms: must be > 0

After the factory returns, :meth:`Params.finish` rejects every name nobody read, so a typo in a
profile is an error rather than a silently ignored setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class ParamError(ValueError):
    """One bad parameter. ``path`` is relative to the plugin's ``params`` ("tau_ms",
    "thresholds.low"); empty for a problem with the mapping itself."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def require(ok: bool, path: str, message: str) -> None:
    """Raise ``ParamError(path, message)`` unless ``ok``; for range checks in constructors."""
    if not ok:
        raise ParamError(path, message)


def check_unit(value: float, path: str) -> None:
    require(math.isfinite(value) and 0.0 <= value <= 1.0, path, "must be between 0 and 1")


def check_positive(value: float, path: str) -> None:
    require(math.isfinite(value) and value > 0, path, "must be > 0")


class Params:
    """Typed reads over one raw parameter mapping (or a nested section of it)."""

    __slots__ = ("_prefix", "_raw", "_read", "_sections")

    def __init__(self, raw: object, prefix: str = "") -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ParamError(prefix, f"must be a mapping, not {type(raw).__name__}")
        for name in raw:
            if not isinstance(name, str):
                raise ParamError(prefix, f"parameter names must be strings, not {name!r}")
        self._raw: Mapping[str, object] = raw
        self._prefix = prefix
        self._read: set[str] = set()
        self._sections: list[Params] = []

    def path(self, name: str = "") -> str:
        """The location of ``name`` relative to the plugin's params (this section if empty)."""
        if not name:
            return self._prefix
        return f"{self._prefix}.{name}" if self._prefix else name

    def _get(self, name: str) -> object:
        self._read.add(name)
        return self._raw.get(name)

    def number(self, name: str, default: float) -> float:
        value = self._get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ParamError(self.path(name), f"must be a number, not {_kind(value)}")
        if not math.isfinite(value):
            raise ParamError(self.path(name), "must be a finite number")
        return float(value)

    def integer(self, name: str, default: int) -> int:
        value = self._get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(self.path(name), f"must be an integer, not {_kind(value)}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ParamError(self.path(name), f"must be true or false, not {_kind(value)}")
        return value

    def string(self, name: str, default: str) -> str:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ParamError(self.path(name), f"must be a string, not {_kind(value)}")
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        value = self._get(name)
        if value is None:
            return ()
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ParamError(self.path(name), "must be a list of strings")
        return tuple(value)

    def section(self, name: str) -> Params:
        """A nested mapping, read the same way; its unread names are reported by ``finish``."""
        sub = Params(self._get(name), self.path(name))
        self._sections.append(sub)
        return sub

    def names(self) -> tuple[str, ...]:
        """Every name in this mapping (for sections keyed by data, like region names)."""
        return tuple(self._raw)

    def finish(self) -> None:
        """Reject names that no read consumed (typos), here and in nested sections."""
        unknown = sorted(set(self._raw) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise ParamError(
                self.path(unknown[0]), f"unknown parameter (known parameters: {known})"
            )
        for sub in self._sections:
            sub.finish()


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__
