"""The simulated KV cache: fixed-size blocks, reference counts and an automatic prefix cache.

Modelled on vLLM's block pool (v1 ``KVCacheManager``/``BlockPool``):

- Capacity is ``num_blocks`` blocks of ``block_size`` tokens. A sequence holds
  ``ceil(tokens / block_size)`` blocks; ``usage`` is the fraction of blocks held by at least one
  sequence (cached blocks nobody holds count as free: they are evicted on demand).
- A *full* block of computed tokens is registered under a chained hash of its tokens and of all
  tokens before it (:func:`block_hashes`), so a block can only be reused by a sequence whose
  whole prefix up to that block is identical. A new sequence looks up its leading block hashes
  and shares the hits (reference count + 1) instead of computing them again.
- Blocks freed by a sequence go back to the pool; registered ones stay findable until they are
  needed for something else. Allocation takes never-registered blocks first, then evicts the
  least recently freed registered block. A sequence's blocks are freed tail first, so its last
  (least shared) blocks are evicted before its first ones.

The same hash chain is what an edge or router would compute to route by prefix affinity: it is
a pure function of token ids and ``block_size``.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

_ROOT = b"meridian-sim-kv"


def block_hashes(
    token_ids: Sequence[int], block_size: int, *, start: int = 0, parent: int | None = None
) -> list[int]:
    """Chained 63-bit hashes of the full blocks of ``token_ids`` from block index ``start``.

    ``parent`` is the hash of block ``start - 1`` (None for the first block). Token ids must fit
    in 32 bits. Incomplete trailing tokens get no hash.
    """
    out: list[int] = []
    prev = parent.to_bytes(8, "big") if parent is not None else _ROOT
    full = len(token_ids) // block_size
    for i in range(start, full):
        chunk = token_ids[i * block_size : (i + 1) * block_size]
        digest = hashlib.blake2b(prev + struct.pack(f">{block_size}I", *chunk), digest_size=8)
        value = int.from_bytes(digest.digest(), "big") >> 1
        out.append(value)
        prev = value.to_bytes(8, "big")
    return out


class KvCache:
    """Block accounting for one engine. Pure bookkeeping: no time, no I/O."""

    def __init__(self, *, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = enable_prefix_caching
        self._refs = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        # Free blocks: never-registered ones (a stack) and registered ones in LRU order.
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        return len(self._free_plain) + len(self._evictable)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    @property
    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks findable by hash (held or free)."""
        return len(self._by_hash)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of leading ``hashes`` that are cached."""
        if not self.prefix_caching:
            return []
        hits: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_take(self, hits: Sequence[int], new_blocks: int) -> bool:
        """Whether ``hits`` can be shared and ``new_blocks`` allocated right now. A hit nobody
        holds is taken out of the free pool, so it counts against the free blocks too."""
        idle_hits = sum(1 for b in hits if self._refs[b] == 0)
        return idle_hits + new_blocks <= self.free_blocks

    def share(self, hits: Sequence[int]) -> None:
        for b in hits:
            if self._refs[b] == 0:
                del self._evictable[b]
            self._refs[b] += 1

    def allocate(self, count: int) -> list[int]:
        if count > self.free_blocks:
            raise RuntimeError(f"KV cache: {count} blocks asked, {self.free_blocks} free")
        out: list[int] = []
        for _ in range(count):
            if self._free_plain:
                b = self._free_plain.pop()
            else:
                b, _ = self._evictable.popitem(last=False)
                old = self._hash_of[b]
                if old is not None:
                    del self._by_hash[old]
                    self._hash_of[b] = None
            self._refs[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Release one reference to each block, tail first (see the module docstring)."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] < 0:
                raise RuntimeError(f"KV block {b} freed more often than taken")
            if self._refs[b] == 0:
                if self._hash_of[b] is not None:
                    self._evictable[b] = None
                else:
                    self._free_plain.append(b)

    def register(self, block: int, block_hash: int) -> None:
        """Make a full, computed block findable by its hash. If identical content is already
        registered (two sequences computed the same prefix at once) the first copy stays the
        one found, and this one is freed as a plain block later."""
        if not self.prefix_caching or self._hash_of[block] is not None:
            return
        if block_hash in self._by_hash:
            return
        self._by_hash[block_hash] = block
        self._hash_of[block] = block_hash
