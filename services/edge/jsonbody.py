"""A request body as one JSON object: strict JSON, as OpenAI's API reads it.

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity`` (and turns ``1e999`` into an
infinite float). None of them is JSON, and none survives the trip to a worker: a protobuf
``Struct`` cannot carry a non-finite number, so a schema holding one failed on every worker it
was retried on. They are refused here, with the other parse errors, as a 400.
"""

from __future__ import annotations

import json
import math
from typing import Any

from services.common.errors import InvalidRequest


class _NotJson(ValueError):
    def __init__(self, literal: str, why: str) -> None:
        super().__init__(literal)
        self.literal = literal
        self.why = why


def _constant(literal: str) -> float:
    raise _NotJson(literal, "is not JSON (NaN and infinities are not numbers in JSON)")


#: Digits an integer literal may have (Python refuses to convert more than 4,300; no field
#: needs more than 20).
MAX_INT_DIGITS = 100


def _bounded_int(literal: str) -> int:
    if len(literal) > MAX_INT_DIGITS:
        raise _NotJson(literal, f"has more than {MAX_INT_DIGITS} digits")
    return int(literal)


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotJson(literal, "is too large for a number (it overflows a 64-bit float)")
    return value


def load_object(body: bytes) -> dict[str, Any]:
    """``body`` (UTF-8 JSON) as a dict; every failure is an :class:`InvalidRequest` (400)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {err.start})") from None
    try:
        data: Any = json.loads(
            text, parse_constant=_constant, parse_float=_finite, parse_int=_bounded_int
        )
    except json.JSONDecodeError as err:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {err.msg} at line {err.lineno} "
            f"column {err.colno}"
        ) from None
    except _NotJson as err:
        shown = err.literal if len(err.literal) <= 40 else err.literal[:40] + "…"
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {shown} {err.why}"
        ) from None
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data
