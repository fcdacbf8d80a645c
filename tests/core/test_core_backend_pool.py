"""The generic backend's KV pool: slots taken and given back, their views edited only in place.

Every edit of a slot goes through ``kv.kvstore``'s explicit functions (write, compact, load_prefix,
prefix_views), which must touch that slot only: another request's slot and the scratch slot keep their bits.
"""

from __future__ import annotations

import pytest
import torch
from lookahead_core.forward.backend import KVTooLong
from lookahead_core.forward.backend.pool import KVPool, KVPoolFull, SlotKV
from lookahead_core.kv.kvstore import KVShape, compact, load_prefix, prefix_views

SHAPE = KVShape(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))


def entries(n: int, fill: float) -> torch.Tensor:
    return torch.full((1, SHAPE.kv_heads, n, SHAPE.head_dim), fill)  # [1, kv_heads, n, head_dim]


def test_slots_come_lowest_first_and_go_back() -> None:
    # three slots: taken 0, 1, 2; giving back 1 makes it the next one taken
    pool = KVPool(SHAPE, slots=3, slot_tokens=16)
    kvs = [pool.take(8) for _ in range(3)]
    assert [kv.slot for kv in kvs] == [0, 1, 2] and pool.free == 0
    pool.give_back(kvs[1])
    assert pool.take(4).slot == 1


def test_a_full_pool_and_a_too_long_request_are_refused() -> None:
    # one slot: a second request finds none; a request longer than a slot is the caller's error
    pool = KVPool(SHAPE, slots=1, slot_tokens=16)
    with pytest.raises(KVTooLong, match="holds 16"):
        pool.take(17)
    pool.take(16)
    with pytest.raises(KVPoolFull):
        pool.take(1)


def test_giving_back_twice_or_a_foreign_cache_changes_nothing() -> None:
    # a slot given back twice is free once; a cache of another pool is not this pool's to free
    pool, other = KVPool(SHAPE, slots=2, slot_tokens=8), KVPool(SHAPE, slots=2, slot_tokens=8)
    kv = pool.take(4)
    pool.give_back(kv)
    pool.give_back(kv)
    assert pool.free == 2
    taken = pool.take(4)
    pool.give_back(other.take(4))  # slot 0 of the other pool: not this one's slot 0
    assert pool.free == 1 and taken.slot == 0


def test_slot_edits_stay_in_their_slot() -> None:
    # write, compact and load_prefix on slot 1 leave slot 0 and the scratch slot bit for bit
    pool = KVPool(SHAPE, slots=2, slot_tokens=8)
    mine, theirs = pool.take(8), pool.take(8)
    for layer in range(SHAPE.layers):
        theirs.write(layer, 0, entries(8, 7.0), entries(8, -7.0))
    pool.keys[0][pool.scratch].fill_(3.0)
    before = [t.clone() for t in (*pool.keys, *pool.values)]
    for layer in range(SHAPE.layers):
        mine.write(layer, 0, torch.arange(4.0).view(1, 1, 4, 1).expand(1, 2, 4, 4), entries(4, 1.0))
    compact(mine, 1, [0, 2])  # entries 1 and 3 -> [1, 3)
    assert mine.length == 3 and mine.keys[0][0, 0, :3, 0].tolist() == [0.0, 1.0, 3.0]
    load_prefix(mine, [(0, [(entries(2, 5.0), entries(2, 6.0))] * SHAPE.layers)], 2)
    assert mine.keys[1][0, 1, :2, 0].tolist() == [5.0, 5.0]
    after = [*pool.keys, *pool.values]
    for b, a in zip(before, after, strict=True):
        assert torch.equal(b[theirs.slot], a[theirs.slot]) and torch.equal(b[pool.scratch], a[pool.scratch])


def test_views_are_the_slot_and_a_freed_slot_is_zeroed() -> None:
    # a SlotKV's buffers are views of its slot (prefix_views hand the prefix cache those bits); a freed slot
    # holds zeros for its next holder
    pool = KVPool(SHAPE, slots=1, slot_tokens=8)
    kv = pool.take(6)
    assert isinstance(kv, SlotKV) and kv.keys[0].shape == (1, 2, 6, 4)
    kv.write(0, 0, entries(3, 2.0), entries(3, 4.0))
    assert torch.equal(prefix_views(kv, 3)[0][0], pool.keys[0][:1, :, :3])
    pool.give_back(kv)
    assert not pool.keys[0].any() and not pool.values[0].any()
