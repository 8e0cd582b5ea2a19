"""The KV block pool: accounting, chained prefix hashes, sharing and eviction."""

from __future__ import annotations

import pytest

from services.worker.sim.kv import KvCache, block_hashes


def cache(num_blocks: int = 8, *, prefix: bool = True) -> KvCache:
    return KvCache(num_blocks=num_blocks, block_size=4, enable_prefix_caching=prefix)


def test_block_hashes_cover_full_blocks_and_chain_the_prefix() -> None:
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2  # the last two tokens do not fill a block
    same_start = block_hashes([*range(8), 99, 99, 99, 99], 4)
    assert same_start[:2] == a
    other_first = block_hashes([42, *range(1, 8)], 4)
    # Block 1 has the same tokens but a different prefix, so it is a different block.
    assert other_first[0] != a[0]
    assert other_first[1] != a[1]


def test_block_hashes_extend_incrementally() -> None:
    tokens = list(range(40))
    whole = block_hashes(tokens, 4)
    head = block_hashes(tokens[:12], 4)
    assert head + block_hashes(tokens, 4, start=3, parent=head[-1]) == whole


def test_usage_counts_held_blocks_only() -> None:
    kv = cache()
    blocks = kv.allocate(6)
    assert (kv.used_blocks, kv.free_blocks, kv.usage) == (6, 2, 0.75)
    kv.free(blocks)
    assert (kv.used_blocks, kv.usage) == (0, 0.0)
    with pytest.raises(RuntimeError):
        kv.allocate(9)


def test_registered_blocks_are_found_shared_and_outlive_their_holder() -> None:
    kv = cache()
    hashes = block_hashes(list(range(12)), 4)
    blocks = kv.allocate(3)
    for b, h in zip(blocks, hashes, strict=True):
        kv.register(b, h)
    assert kv.lookup(hashes) == blocks
    kv.free(blocks)
    assert kv.used_blocks == 0
    # Still findable after release; a longer prompt with the same start hits its first blocks.
    longer = block_hashes([*range(12), 7, 7, 7, 7], 4)
    assert kv.lookup(longer) == blocks
    assert kv.can_take(blocks, 5)  # 3 idle hits + 5 new = 8 free blocks
    assert not kv.can_take(blocks, 6)
    kv.share(blocks)
    assert kv.used_blocks == 3
    kv.share(blocks[:1])  # a second holder of the first block
    kv.free(blocks)
    assert kv.used_blocks == 1


def test_allocation_prefers_plain_blocks_then_evicts_the_least_recently_freed() -> None:
    kv = cache(4)
    first = kv.allocate(2)
    hashes = block_hashes(list(range(8)), 4)
    for b, h in zip(first, hashes, strict=True):
        kv.register(b, h)
    kv.free(first)  # tail first: first[1] becomes the oldest evictable block
    fresh = kv.allocate(2)
    assert set(fresh).isdisjoint(first)  # the two never-registered blocks went first
    assert kv.lookup(hashes) == first
    evicted = kv.allocate(1)
    assert evicted == [first[1]]
    assert kv.lookup(hashes) == first[:1]  # the chain's head survives
    assert kv.cached_blocks == 1


def test_duplicate_content_keeps_the_first_copy() -> None:
    kv = cache()
    h = block_hashes(list(range(4)), 4)[0]
    a, b = kv.allocate(2)
    kv.register(a, h)
    kv.register(b, h)
    assert kv.lookup([h]) == [a]
    kv.free([b])
    assert kv.cached_blocks == 1


def test_without_prefix_caching_nothing_is_found() -> None:
    kv = cache(prefix=False)
    h = block_hashes(list(range(4)), 4)[0]
    (a,) = kv.allocate(1)
    kv.register(a, h)
    assert kv.lookup([h]) == []


def test_freeing_twice_is_a_bug_caught_at_once() -> None:
    kv = cache()
    blocks = kv.allocate(1)
    kv.free(blocks)
    with pytest.raises(RuntimeError):
        kv.free(blocks)
