"""PrefixKVCache: longest-prefix hits, tenant isolation, LRU by bytes, per-tenant budgets, covered entries,
shared parts held once, counters."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lookahead_core.kv.prefix_cache import KV, Pieces, PrefixCacheConfig, PrefixKVCache
from lookahead_core.kv.prefix_tree import attach_point, common_prefix, eviction_victims, pieces_of

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS, HEADS, DIM = 2, 1, 2  # shape of the hand-made KV: [1, HEADS, n, DIM] per layer
ID_BYTES = 8  # a token's id, kept beside its KV (int64) and counted with it (issue 46)
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 4 + ID_BYTES  # float32 KV of one token over all layers, and its id
ROOM = 1 << 20  # a byte budget nothing in these tests reaches


def make_kv(ids: Sequence[int], mark: int = 0) -> KV:
    """KV whose token p of layer l is keys [100 * l + p, 1000 * mark + ids[p]] and values minus that."""
    n = len(ids)
    pos = torch.arange(n, dtype=torch.float32)  # [n]
    tok = torch.tensor(list(ids), dtype=torch.float32) + 1000.0 * mark  # [n]
    kv: KV = []
    for layer in range(LAYERS):
        keys = torch.stack([100.0 * layer + pos, tok], dim=-1).view(1, HEADS, n, DIM)  # [1, 1, n, 2]
        kv.append((keys, -keys))
    return kv


def joined(pieces: Pieces) -> KV:
    """The pieces of a hit as one KV, after checking they tile [0, n) in order."""
    at = 0
    for start, part in pieces:
        assert start == at
        at += part[0][0].shape[-2]
    return [(torch.cat([part[layer][0] for _, part in pieces], dim=-2),  # [1, HEADS, n, DIM]
             torch.cat([part[layer][1] for _, part in pieces], dim=-2)) for layer in range(LAYERS)]


def check_view(pieces: Pieces | None, ids: Sequence[int], mark: int = 0) -> None:
    """``pieces`` hold exactly the KV of ``ids`` (positions 0..n-1, those tokens, that tenant mark)."""
    assert pieces is not None
    kv = joined(pieces)
    want = make_kv(ids, mark)
    for (keys, values), (want_k, want_v) in zip(kv, want, strict=True):
        assert torch.equal(keys, want_k)
        assert torch.equal(values, want_v)


def cache(max_bytes: int = ROOM, min_tokens: int = 1, tenant_share: float = 1.0) -> PrefixKVCache:
    return PrefixKVCache(PrefixCacheConfig(max_bytes=max_bytes, min_tokens=min_tokens, tenant_share=tenant_share))


# ---- hits ----------------------------------------------------------------------------------------
# (stored sequences, query, expected n): the longest prefix shared with any stored entry
HIT_CASES: list[tuple[list[list[int]], list[int], int]] = [
    # exact repeat: the whole prompt
    ([[1, 2, 3, 4]], [1, 2, 3, 4], 4),
    # the query goes on past the entry: the whole entry
    ([[1, 2, 3]], [1, 2, 3, 9, 9], 3),
    # partial prefix of a stored entry (diverges at position 2)
    ([[1, 2, 3, 4]], [1, 2, 7, 4], 2),
    # the query is a strict prefix of a stored entry
    ([[1, 2, 3, 4, 5]], [1, 2, 3], 3),
    # longest of several entries wins, whatever the order they were stored in
    ([[1, 2, 9], [1, 2, 3, 4, 8], [1, 5]], [1, 2, 3, 4, 5], 4),
    # first token differs from every entry: miss
    ([[1, 2, 3], [4, 5]], [7, 1, 2, 3], 0),
]


@pytest.mark.parametrize(("stored", "query", "n"), HIT_CASES)
def test_lookup_returns_longest_prefix(stored: list[list[int]], query: list[int], n: int) -> None:
    c = cache()
    for ids in stored:
        c.put("t", ids, make_kv(ids))
    got, kv = c.lookup("t", query)
    assert got == n
    if n:
        check_view(kv, query[:n])
    else:
        assert kv is None


def test_lookup_returns_views_of_the_stored_tensors() -> None:
    c = cache()
    kv = make_kv([1, 2, 3])
    c.put("t", [1, 2, 3], kv)
    _, got = c.lookup("t", [1, 2])
    assert got is not None
    assert got[0][1][0][0].data_ptr() == kv[0][0].data_ptr()  # a view, not a copy


def test_other_tenant_never_hits() -> None:
    c = cache()
    c.put("a", [1, 2, 3], make_kv([1, 2, 3], mark=1))
    assert c.lookup("b", [1, 2, 3]) == (0, None)  # identical ids, other tenant
    c.put("b", [1, 2], make_kv([1, 2], mark=2))
    n, kv = c.lookup("b", [1, 2, 3])
    assert n == 2  # b's own shorter entry, not a's longer one
    check_view(kv, [1, 2], mark=2)


# (stored, query, max_tokens, expected n)
CAP_CASES: list[tuple[list[int], list[int], int, int]] = [
    # the engine leaves one token to prefill on an exact repeat
    ([1, 2, 3, 4], [1, 2, 3, 4], 3, 3),
    # the cap is above the match: no effect
    ([1, 2, 3, 4], [1, 2, 9], 3, 2),
    # a cap of 0 never hits
    ([1, 2, 3], [1, 2, 3], 0, 0),
]


@pytest.mark.parametrize(("stored", "query", "cap", "n"), CAP_CASES)
def test_max_tokens_caps_n(stored: list[int], query: list[int], cap: int, n: int) -> None:
    c = cache()
    c.put("t", stored, make_kv(stored))
    got, kv = c.lookup("t", query, max_tokens=cap)
    assert got == n
    if n:
        check_view(kv, query[:n])


def test_short_match_reports_zero() -> None:
    c = cache(min_tokens=3)
    c.put("t", [1, 2, 3, 4], make_kv([1, 2, 3, 4]))
    assert c.lookup("t", [1, 2, 9]) == (0, None)  # 2 shared tokens < min_tokens
    assert c.lookup("t", [1, 2, 3, 9])[0] == 3  # 3 shared tokens is enough
    c.put("t", [5, 6], make_kv([5, 6]))  # shorter than min_tokens: could never hit, not stored
    assert c.sequences("t") == [(1, 2, 3, 4)]


# ---- put: covered entries, slicing, validation -----------------------------------------------------
def test_a_longer_put_continues_a_stored_prefix() -> None:
    c = cache()
    c.put("t", [1, 2], make_kv([1, 2]))
    c.put("t", [1, 3], make_kv([1, 3]))  # keeps only [3]: token 1 is [1, 2]'s
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))  # keeps only [3] past [1, 2], which it covers; not [1, 3]
    assert sorted(c.sequences("t")) == [(1, 2, 3), (1, 3)]
    assert c.stats().bytes == 4 * TOKEN_BYTES  # 1, 2 once, then 3 in each


def test_prefix_of_a_stored_entry_is_not_stored_but_touches_it() -> None:
    c = cache(max_bytes=6 * TOKEN_BYTES)
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))
    c.put("t", [4, 5, 6], make_kv([4, 5, 6]))
    c.put("t", [1, 2], make_kv([1, 2]))  # covered: not stored, [1, 2, 3] becomes most recent
    assert c.sequences("t") == [(1, 2, 3), (4, 5, 6)]
    c.put("t", [7], make_kv([7]))  # evicts the least recent: [4, 5, 6]
    assert c.sequences("t") == [(1, 2, 3), (7,)]


def test_put_keeps_only_len_ids_tokens() -> None:
    c = cache()
    c.put("t", [1, 2], make_kv([1, 2, 3, 4]))  # the engine's KV may run past the prompt
    assert c.stats().bytes == 2 * TOKEN_BYTES
    n, kv = c.lookup("t", [1, 2, 3])
    assert n == 2
    check_view(kv, [1, 2])


def test_put_copies_a_slice_that_would_pin_a_longer_storage() -> None:
    c = cache()
    kv = make_kv([1, 2, 3, 4])
    c.put("t", [1, 2], kv)
    _, got = c.lookup("t", [1, 2])
    assert got is not None
    assert got[0][1][0][0].untyped_storage().nbytes() == 2 * HEADS * DIM * 4  # only the 2 kept tokens


def test_put_rejects_kv_shorter_than_ids() -> None:
    with pytest.raises(ValueError, match="layer 0"):
        cache().put("t", [1, 2, 3], make_kv([1, 2]))


# ---- a shared part is held once -----------------------------------------------------------------------
def test_prompts_sharing_a_prefix_hold_it_once() -> None:
    c = cache(min_tokens=2)
    first = make_kv([1, 2, 3, 4])
    c.put("t", [1, 2, 3, 4], first)
    c.put("t", [1, 2, 3, 7, 8], make_kv([1, 2, 3, 7, 8]))  # keeps only [7, 8]
    assert c.stats().bytes == 6 * TOKEN_BYTES  # 1, 2, 3 once; 4; 7, 8
    n, pieces = c.lookup("t", [1, 2, 3, 7, 8, 9])
    assert n == 5
    check_view(pieces, [1, 2, 3, 7, 8])
    assert pieces is not None and [start for start, _ in pieces] == [0, 3]  # the first prompt's, then its own
    assert pieces[0][1][0][0].data_ptr() == first[0][0].data_ptr()  # a view of the first prompt's tensors
    check_view(c.lookup("t", [1, 2, 3, 4])[1], [1, 2, 3, 4])  # the first prompt is whole


def test_a_share_below_min_tokens_is_held_twice() -> None:
    c = cache(min_tokens=3)
    c.put("t", [1, 2, 3, 4], make_kv([1, 2, 3, 4]))
    c.put("t", [1, 2, 7, 8], make_kv([1, 2, 7, 8]))  # 2 shared tokens: not worth a parent
    assert c.stats().bytes == 8 * TOKEN_BYTES
    n, pieces = c.lookup("t", [1, 2, 7, 8])
    assert n == 4 and pieces is not None and len(pieces) == 1
    check_view(pieces, [1, 2, 7, 8])


def test_three_levels_attach_to_the_entry_holding_the_last_shared_token() -> None:
    c = cache(min_tokens=1)
    c.put("t", [1, 2, 3, 4, 5], make_kv([1, 2, 3, 4, 5]))  # root: tokens 0-4
    c.put("t", [1, 2, 3, 8, 9], make_kv([1, 2, 3, 8, 9]))  # attaches at 3 to the root
    c.put("t", [1, 2, 3, 8, 6], make_kv([1, 2, 3, 8, 6]))  # attaches at 4 to the second (it holds token 3)
    c.put("t", [1, 2, 7], make_kv([1, 2, 7]))  # attaches at 2 to the root, though the last match is deeper
    assert c.stats().bytes == (5 + 2 + 1 + 1) * TOKEN_BYTES
    for ids in ([1, 2, 3, 4, 5], [1, 2, 3, 8, 9], [1, 2, 3, 8, 6], [1, 2, 7]):
        n, pieces = c.lookup("t", ids)
        assert n == len(ids)
        check_view(pieces, ids)


def test_an_entry_others_attach_to_outlives_them() -> None:
    c = cache(max_bytes=7 * TOKEN_BYTES, min_tokens=2)
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))  # the least recent of all, but [1, 2, 3, 4, 5] attaches to it
    c.put("t", [1, 2, 3, 4, 5], make_kv([1, 2, 3, 4, 5]))  # keeps [4, 5]: covers [1, 2, 3]
    c.put("t", [6, 6], make_kv([6, 6]))  # 7 tokens: all fits
    c.lookup("t", [6, 6])  # now [1, 2, 3, 4, 5] is the least recent prompt
    c.put("t", [7, 7], make_kv([7, 7]))  # 9 > 7: the leaf [4, 5] goes, not its parent
    assert sorted(c.sequences("t")) == [(1, 2, 3), (6, 6), (7, 7)]
    c.put("t", [8, 8], make_kv([8, 8]))  # 9 > 7: [1, 2, 3] is a leaf now, and the least recent
    assert sorted(c.sequences("t")) == [(6, 6), (7, 7), (8, 8)]
    assert c.lookup("t", [1, 2, 3]) == (0, None)
    assert c.stats().evictions == 2


def test_a_prompt_that_cannot_fit_beside_its_parent_is_not_kept() -> None:
    c = cache(max_bytes=4 * TOKEN_BYTES, min_tokens=2)
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))
    c.put("t", [1, 2, 8, 9, 9], make_kv([1, 2, 8, 9, 9]))  # its own 3 tokens fit alone, not beside [1, 2, 3]
    assert c.sequences("t") == [(1, 2, 3)]
    s = c.stats()
    assert (s.entries, s.bytes, s.evictions) == (1, 3 * TOKEN_BYTES, 0)


def test_forget_drops_a_whole_tree() -> None:
    c = cache(min_tokens=1)
    for ids in ([1, 2, 3], [1, 2, 4], [1, 5]):
        c.put("a", ids, make_kv(ids, mark=1))
    c.put("b", [1, 2, 3], make_kv([1, 2, 3], mark=2))
    assert c.forget_tenant("a") == 3
    assert c.sequences("a") == [] and c.lookup("a", [1, 2, 3]) == (0, None)
    assert c.stats().bytes == 3 * TOKEN_BYTES
    check_view(c.lookup("b", [1, 2, 3])[1], [1, 2, 3], mark=2)


# (chain as (key, start) from the matching entry up to its root, shared tokens, entry to attach to)
ATTACH_CASES: list[tuple[list[tuple[int, int]], int, int | None]] = [
    # one root: attach to it
    ([(0, 0)], 3, 0),
    # the match ends inside the deepest entry: attach there
    ([(2, 5), (1, 3), (0, 0)], 6, 2),
    # the match ends exactly where the deepest entry starts: its parent holds the last shared token
    ([(2, 5), (1, 3), (0, 0)], 5, 1),
    # the match ends inside the root's part
    ([(2, 5), (1, 3), (0, 0)], 2, 0),
    # nothing shared: no parent
    ([(0, 0)], 0, None),
]


@pytest.mark.parametrize(("chain", "shared", "parent"), ATTACH_CASES)
def test_attach_point(chain: list[tuple[int, int]], shared: int, parent: int | None) -> None:
    assert attach_point(chain, shared) == parent


# (chain, n, pieces as (key, start, length) in token order)
PIECE_CASES: list[tuple[list[tuple[int, int]], int, list[tuple[int, int, int]]]] = [
    # a root alone: its first n tokens
    ([(0, 0)], 4, [(0, 0, 4)]),
    # three levels, n inside the deepest: each parent up to where its child starts
    ([(2, 5), (1, 3), (0, 0)], 7, [(0, 0, 3), (1, 3, 2), (2, 5, 2)]),
    # n ends inside a parent: the deeper entries give nothing
    ([(2, 5), (1, 3), (0, 0)], 4, [(0, 0, 3), (1, 3, 1)]),
    # n ends where the deepest starts: it gives nothing
    ([(2, 5), (1, 3), (0, 0)], 5, [(0, 0, 3), (1, 3, 2)]),
]


@pytest.mark.parametrize(("chain", "n", "pieces"), PIECE_CASES)
def test_pieces_of(chain: list[tuple[int, int]], n: int, pieces: list[tuple[int, int, int]]) -> None:
    assert pieces_of(chain, n) == pieces


# ---- LRU by bytes ----------------------------------------------------------------------------------
def test_lru_evicts_least_recently_used_first() -> None:
    c = cache(max_bytes=7 * TOKEN_BYTES)
    c.put("a", [1, 1], make_kv([1, 1]))
    c.put("a", [2, 2, 2], make_kv([2, 2, 2]))
    c.put("a", [3, 3], make_kv([3, 3]))
    assert c.lookup("a", [1, 1])[0] == 2  # touch [1, 1]: now [2, 2, 2] is the least recent
    c.put("a", [4, 4], make_kv([4, 4]))  # 9 tokens > 7: evict [2, 2, 2] only
    assert sorted(c.sequences("a")) == [(1, 1), (3, 3), (4, 4)]
    c.put("a", [6, 6, 6, 6], make_kv([6, 6, 6, 6]))  # 10 tokens > 7: evict [3, 3], then [1, 1]
    assert sorted(c.sequences("a")) == [(4, 4), (6, 6, 6, 6)]
    s = c.stats()
    assert (s.entries, s.bytes, s.evictions) == (2, 6 * TOKEN_BYTES, 3)


def test_oversize_entry_is_not_stored() -> None:
    c = cache(max_bytes=3 * TOKEN_BYTES)
    c.put("t", [1, 2], make_kv([1, 2]))
    c.put("t", [1, 2, 3, 4], make_kv([1, 2, 3, 4]))  # alone above the budget: dropped, nothing evicted
    assert c.sequences("t") == [(1, 2)]
    assert c.stats().evictions == 0
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))  # exactly the budget: stored, covers [1, 2]
    assert c.sequences("t") == [(1, 2, 3)]


# ---- per-tenant budgets (issue 22): eviction_victims on (key, owner, bytes), then the cache ------------
# (lru as (key, owner, bytes) least recent first, putting tenant, its budget, the total budget, pinned, victims)
VICTIM_CASES: list[tuple[list[tuple[int, str, int]], str, int, int, set[int], list[int]]] = [
    # within both budgets: nothing goes
    ([(0, "b", 3), (1, "a", 2)], "a", 4, 8, {1}, []),
    # a past its own budget loses its own least recent entry, though b's is older
    ([(0, "b", 3), (1, "a", 2), (2, "a", 2), (3, "a", 2)], "a", 4, 100, {3}, [1]),
    # past the total: the heaviest owner's least recent entry (a: 6), not the oldest one (b's)
    ([(0, "b", 2), (1, "a", 3), (2, "a", 3), (3, "b", 2)], "b", 10, 8, {3}, [1]),
    # the new entry is never chosen, and a holds only it: a is the heaviest, so nothing goes (issue 46: b,
    # lighter, is not flushed for it; the cache then drops the new entry)
    ([(0, "b", 3), (1, "a", 6)], "a", 8, 8, {1}, []),
    # the same with b the heavier: b's entry goes for a's new one
    ([(0, "b", 6), (1, "a", 3)], "a", 8, 8, {1}, [0]),
    # ties between the heaviest: the owner seen first in LRU order
    ([(0, "a", 2), (1, "b", 2), (2, "c", 1)], "c", 5, 4, {2}, [0]),
    # both rules: a back to its budget first, then the total from the heaviest (b)
    ([(0, "b", 5), (1, "b", 1), (2, "a", 3), (3, "a", 3)], "a", 4, 7, {3}, [2, 0]),
    # an entry others attach to stays though least recent: the next one goes, and its bytes still count
    ([(0, "a", 3), (1, "a", 2), (2, "a", 2)], "a", 5, 100, {0, 2}, [1]),
    # nothing but pinned entries: none go, whatever the budgets say
    ([(0, "a", 3), (1, "a", 2)], "a", 1, 1, {0, 1}, []),
]


@pytest.mark.parametrize(("lru", "tenant", "tenant_bytes", "max_bytes", "pinned", "victims"), VICTIM_CASES)
def test_eviction_victims(lru: list[tuple[int, str, int]], tenant: str, tenant_bytes: int, max_bytes: int,
                          pinned: set[int], victims: list[int]) -> None:
    assert eviction_victims(lru, tenant, tenant_bytes, max_bytes, pinned) == victims


def test_eviction_victims_take_a_parent_once_its_last_child_went() -> None:
    # 0 <- 1 <- 2 (each attached to the one before), 3 alone: a must shed 5 of its 9 bytes. The leaf 2
    # goes, then 1 (a leaf now, older than 3), then 0; 3, the most recent, stays
    lru = [(2, "a", 2), (1, "a", 2), (0, "a", 2), (3, "a", 3)]
    assert eviction_victims(lru, "a", 4, 100, {3}, {1: 0, 2: 1}) == [2, 1, 0]
    # with the new entry 3 attached to 0, 0 never becomes a leaf: 2 and 1 would leave 5 bytes, so none go
    assert eviction_victims(lru, "a", 4, 100, {3}, {1: 0, 2: 1, 3: 0}) == []


def test_a_tenant_past_its_share_evicts_only_its_own_entries() -> None:
    c = cache(max_bytes=8 * TOKEN_BYTES, tenant_share=0.5)  # each tenant: 4 tokens
    c.put("b", [9, 9], make_kv([9, 9], mark=2))  # b's, and the least recent of all
    for first in range(1, 6):  # a asks for 10 tokens: more than its share, more than all
        c.put("a", [first, first], make_kv([first, first], mark=1))
    assert sorted(c.sequences("a")) == [(4, 4), (5, 5)]  # its own two most recent: 4 tokens
    n, kv = c.lookup("b", [9, 9])
    assert n == 2
    check_view(kv, [9, 9], mark=2)
    c.put("a", [7, 7, 7, 7, 7], make_kv([7, 7, 7, 7, 7]))  # alone above a's share: not stored
    assert sorted(c.sequences("a")) == [(4, 4), (5, 5)]
    s = c.stats()
    assert (s.entries, s.bytes, s.evictions) == (3, 6 * TOKEN_BYTES, 3)


def test_past_the_total_the_heaviest_tenant_gives_up_its_entry() -> None:
    c = cache(max_bytes=6 * TOKEN_BYTES, tenant_share=0.5)  # shares add up to more than the whole
    c.put("b", [2, 2], make_kv([2, 2]))  # the least recent of all
    c.put("a", [1, 1, 1], make_kv([1, 1, 1]))  # a: 3 tokens, the most
    c.put("c", [3, 3], make_kv([3, 3]))  # 7 tokens > 6: a's entry goes, not b's older one
    assert (c.sequences("a"), c.sequences("b"), c.sequences("c")) == ([], [(2, 2)], [(3, 3)])


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_tenant_share_must_be_a_fraction(share: float) -> None:
    with pytest.raises(ValueError, match="tenant_share"):
        PrefixCacheConfig(tenant_share=share)


# ---- forget_tenant, stats---------------------------------------------------------------------------
def test_drop_tenant_forgets_only_that_tenant() -> None:
    c = cache()
    c.put("a", [1, 2], make_kv([1, 2]))
    c.put("a", [3], make_kv([3]))
    c.put("b", [1, 2], make_kv([1, 2]))
    assert c.forget_tenant("a") == 2
    assert c.forget_tenant("a") == 0  # already gone
    assert c.lookup("a", [1, 2]) == (0, None)
    assert c.lookup("b", [1, 2])[0] == 2
    s = c.stats()
    assert (s.entries, s.bytes, s.evictions) == (1, 2 * TOKEN_BYTES, 0)


def test_stats_count_lookups_and_hit_tokens() -> None:
    c = cache()
    c.put("t", [1, 2, 3], make_kv([1, 2, 3]))
    c.lookup("t", [1, 2, 3])  # hit 3
    c.lookup("t", [1, 9])  # hit 1
    c.lookup("t", [9])  # miss
    c.lookup("u", [1, 2, 3])  # other tenant: miss
    s = c.stats()
    assert (s.lookups, s.hits, s.hit_tokens) == (4, 2, 4)
    assert (s.entries, s.bytes) == (1, 3 * TOKEN_BYTES)


def test_common_prefix_stops_at_the_shorter_array() -> None:
    # a query [1, 0] shares one token with [1], however [1] would be padded; two with [1, 0, 5]
    assert common_prefix(np.array([1]), np.array([1, 0])) == 1
    assert common_prefix(np.array([1, 0, 5]), np.array([1, 0])) == 2
    assert common_prefix(np.array([2, 0]), np.array([1, 0])) == 0


# ---- property: lookups agree with a brute-force longest common prefix over the live entries ---------
TENANTS = ("a", "b")  # mark 1 and 2 in the KV values
token_lists = st.lists(st.integers(0, 2), min_size=0, max_size=6)  # tiny alphabet: many shared prefixes
ops = st.lists(
    st.tuples(st.booleans(), st.sampled_from(TENANTS), token_lists, st.none() | st.integers(0, 6)),
    min_size=1,
    max_size=30,
)


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, budget=st.integers(0, 12), min_tokens=st.integers(1, 3), share=st.sampled_from((0.5, 1.0)))
def test_lookup_matches_brute_force_oracle(
    ops: list[tuple[bool, str, list[int], int | None]], budget: int, min_tokens: int, share: float
) -> None:
    c = cache(max_bytes=budget * TOKEN_BYTES, min_tokens=min_tokens, tenant_share=share)
    for is_put, tenant, ids, cap in ops:
        mark = TENANTS.index(tenant) + 1
        if is_put:
            c.put(tenant, ids, make_kv(ids, mark))
            continue
        live = c.sequences(tenant)
        query = ids if cap is None else ids[:cap]
        best = max((lcp(s, query) for s in live), default=0)
        want = best if best >= min_tokens else 0
        n, kv = c.lookup(tenant, ids, max_tokens=cap)
        assert n == want
        if n:
            check_view(kv, ids[:n], mark)  # this tenant's KV of exactly these tokens
        else:
            assert kv is None
    # invariants: no live entry covers another; the bytes lie between every distinct prefix held once and
    # every prompt held whole, and within both budgets
    low = high = 0
    for tenant in TENANTS:
        live = c.sequences(tenant)
        for i, s in enumerate(live):
            assert all(lcp(s, t) < len(s) for j, t in enumerate(live) if j != i)
        distinct = len({s[:k] for s in live for k in range(1, len(s) + 1)}) * TOKEN_BYTES
        assert distinct <= c.config.tenant_bytes
        low += distinct
        high += sum(len(s) for s in live) * TOKEN_BYTES
    assert low <= c.stats().bytes <= min(high, budget * TOKEN_BYTES)
