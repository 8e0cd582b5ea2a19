"""KV-cache block accounting for the fast worker model, at the granularity of shared prefixes.

``services.worker.sim.kv.KvCache`` tracks every block (a list of ``num_blocks`` slots and a hash
per block): exact, and about 100 KB per worker once its cache is warm — 1 GB for 10,000
workers. Here a worker's cache holds one :class:`Entry` per *shared prefix* (a tenant's system
prompt, a conversation's history) instead: how many full blocks of it are cached, and how many
running sequences hold it. The rules are KvCache's:

- ``usage`` = blocks held by running sequences (their private blocks plus the entries they
  hold) / capacity; cached entries nobody holds count as free and are evicted on demand, least
  recently released first, tail blocks first (an entry shrinks before it disappears);
- a prefix hit needs the whole chain before it (a conversation's history is found only while
  its tenant's system prompt is), as chained block hashes do;
- blocks become findable when computed (a prompt's at the end of its prefill, a finished
  turn's outputs at its end).

What it does not model: reuse of unshared tails (a question's own blocks, never asked twice).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Entry:
    key: object
    blocks: int = 0
    refs: int = 0


class PrefixKv:
    __slots__ = ("_evictable", "entries", "evictable", "pinned", "private", "total")

    def __init__(self, total_blocks: int) -> None:
        self.total = total_blocks
        self.private = 0  # blocks of running sequences not in any entry
        self.pinned = 0  # blocks of entries held by at least one sequence
        self.evictable = 0  # blocks of entries nobody holds
        self.entries: dict[object, Entry] = {}
        self._evictable: OrderedDict[object, Entry] = OrderedDict()

    @property
    def free(self) -> int:
        """Blocks that can be allocated now (evicting cached entries if need be)."""
        return self.total - self.private - self.pinned

    @property
    def usage(self) -> float:
        return (self.private + self.pinned) / self.total

    def lookup(self, chain: tuple[tuple[object, int], ...], limit: int) -> list[tuple[Entry, int]]:
        """The cached part of a prefix chain ``((key, cap_blocks_total), ...)``: the entries
        and the blocks each contributes, walking from the root while each level is whole."""
        out: list[tuple[Entry, int]] = []
        have = 0
        for key, cap in chain:
            cap = min(cap, limit)
            if cap <= have:
                break
            entry = self.entries.get(key)
            if entry is None or entry.blocks == 0:
                break
            take = min(entry.blocks, cap - have)
            out.append((entry, take))
            have += take
            if have < cap:
                break
        return out

    def idle_blocks(self, hits: list[tuple[Entry, int]]) -> int:
        return sum(e.blocks for e, _ in hits if e.refs == 0)

    def hold(self, entry: Entry) -> None:
        if entry.refs == 0:
            self._evictable.pop(entry.key, None)
            self.evictable -= entry.blocks
            self.pinned += entry.blocks
        entry.refs += 1

    def release(self, entry: Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0:
            self.pinned -= entry.blocks
            if entry.blocks:
                self.evictable += entry.blocks
                self._evictable[entry.key] = entry
            else:
                self.entries.pop(entry.key, None)

    def allocate(self, n: int) -> None:
        """Take ``n`` private blocks (the caller checked ``free``), evicting as needed."""
        self.private += n
        over = self.private + self.pinned + self.evictable - self.total
        while over > 0 and self._evictable:
            key, entry = next(iter(self._evictable.items()))
            take = min(over, entry.blocks)
            entry.blocks -= take
            self.evictable -= take
            over -= take
            if entry.blocks == 0:
                del self._evictable[key]
                self.entries.pop(key, None)

    def free_private(self, n: int) -> None:
        self.private -= n

    def register(self, key: object, blocks: int, holder_refs: bool) -> tuple[Entry, int]:
        """Grow entry ``key`` to ``blocks`` blocks from the caller's private blocks; returns
        the entry and how many private blocks moved into it. ``holder_refs``: the caller
        holds the entry already (else it takes a hold)."""
        entry = self.entries.get(key)
        if entry is None:
            entry = Entry(key)
            self.entries[key] = entry
        if not holder_refs:
            self.hold(entry)
        grow = max(0, blocks - entry.blocks)
        if grow:
            entry.blocks += grow
            self.private -= grow
            self.pinned += grow
        return entry, grow

    def clear(self) -> None:
        self.private = self.pinned = self.evictable = 0
        self.entries.clear()
        self._evictable.clear()
