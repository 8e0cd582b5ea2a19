"""Recursive pydantic models, the structured outputs a generator must end validly: a tree
through a required list, a chain through a required Optional, a thread through an optional
property and a list of Optionals."""

from __future__ import annotations

from pydantic import BaseModel


class Tree(BaseModel):
    """Ends where a level takes no children."""

    label: str
    children: list[Tree]


class Chain(BaseModel):
    """Ends at a ``null`` (``anyOf`` with a null branch)."""

    value: int
    next: Chain | None


class Thread(BaseModel):
    """Ends where the optional reply is left out."""

    text: str
    reply: Thread | None = None
    quotes: list[Thread | None] = []
