"""JSON values (JSON schemas) ↔ ``google.protobuf.Struct``, the contracts' typed JSON.

``Struct`` keeps JSON's data model except one thing: every number is a double. Schemas are
full of integers (``minItems: 1``, ``maximum: 10``) that some grammar compilers refuse as
``1.0``, so :func:`from_struct` turns integral doubles back into ints. (A schema that meant
``1.0`` gets ``1``: the same number to every JSON-schema validator.)
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import json_format, struct_pb2


def to_struct(value: dict[str, Any], out: struct_pb2.Struct | None = None) -> struct_pb2.Struct:
    """``value`` as a Struct (written into ``out`` when given, e.g. a message's field)."""
    struct = out if out is not None else struct_pb2.Struct()
    struct.update(value)
    return struct


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """The JSON object a Struct holds, with integral numbers as ints."""
    return cast(dict[str, Any], _ints(json_format.MessageToDict(struct)))


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
