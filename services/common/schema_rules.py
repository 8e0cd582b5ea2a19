"""Rules every JSON schema a request carries is held to, at the edge and again at the worker
(which any gRPC client can reach): the drafts ``$schema`` may name — any other is refused,
never fetched, since a metaschema check would fetch it — and how deep it may nest, checked
level by level so a hostile schema cannot exhaust the stack."""

from __future__ import annotations

from typing import Any

#: The drafts a schema may name in ``$schema`` (any other is refused, never fetched).
KNOWN_DRAFTS = frozenset(
    f"{scheme}://json-schema.org/{draft}{end}"
    for scheme in ("http", "https")
    for draft in (
        "draft-04/schema",
        "draft-06/schema",
        "draft-07/schema",
        "draft/2019-09/schema",
        "draft/2020-12/schema",
    )
    for end in ("", "#")
)


def nested_past(value: object, room: int) -> str | None:
    """The JSON pointer of the first container nested past ``room`` levels (``""``: the value
    itself), or ``None``. Level by level and iterative, so a hostile schema cannot exhaust the
    stack, and no path is built unless one is too deep (building one per node was a third of
    a second for a few megabytes of schemas)."""
    level: list[object] = [value] if isinstance(value, (dict, list)) else []
    depth = 1
    while level:
        if depth > room:
            return _pointer_past(value, room)
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)  # type: ignore[attr-defined]
            if isinstance(child, (dict, list))
        ]
        depth += 1
    return None


def _pointer_past(value: object, room: int) -> str:
    """The pointer of a container nested past ``room`` levels (one is known to exist)."""
    stack: list[tuple[object, str, int]] = [(value, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if depth > room:
            return path
        stack.extend((v, f"{path}/{k}", depth + 1) for k, v in items)
    raise AssertionError("no container is nested that deep")
