"""Issue 46, finding 2: the prefix cache's match index stays inside its budget, is never rebuilt whole, and
its epoch is read without waiting on the cache's lock.

A tenant sends many prompts sharing one long root and differing only in their last tokens. The cache then
holds the root's KV once and each prompt's short suffix, and so must its match index: token ids of the
suffixes, not of every whole prompt (which grew with entries x prompt length, uncounted), and counted in
the bytes the cache reports and budgets. Storing one more prompt (evicting the least recent one to make
room) and looking one up must cost work in proportion to the prompt, not to the tenant's every entry
(the old padded index was dropped on each add or remove and rebuilt, inside the shared step, at the next
match). And the generator reads a tenant's epoch on its event loop: it must not wait while the engine's
thread holds the cache's lock.
"""

from __future__ import annotations

import threading
import tracemalloc

import torch
from lookahead_core.kv.prefix_cache import KV, PrefixCacheConfig, PrefixKVCache

ROOT = list(range(100_000, 102_048))  # 2,048 tokens every prompt starts with
SUFFIX = 16  # each prompt's own last tokens
ENTRIES = 200  # prompts stored under the root
ID_BYTES = 4  # the least a token id can be kept in (int32)
KV_TOKEN_BYTES = 2 * 4  # keys and values of the hand-made KV below: one layer, [1, 1, n, 1] fp32


def kv(n: int) -> KV:
    return [(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1))]


def prompt(i: int) -> list[int]:
    return ROOT + [i * SUFFIX + j for j in range(SUFFIX)]


def filled(max_bytes: int = 1 << 30) -> PrefixKVCache:
    cache = PrefixKVCache(PrefixCacheConfig(max_bytes=max_bytes, min_tokens=16))
    for i in range(ENTRIES):
        cache.put("a", prompt(i), kv(len(ROOT) + SUFFIX))
    return cache


def test_the_reported_bytes_count_the_ids_of_the_suffixes_only() -> None:
    cache = filled()
    tokens = len(ROOT) + ENTRIES * SUFFIX  # the root once, then each suffix: what the KV holds
    stats = cache.stats()
    assert stats.entries == ENTRIES  # the first prompt whole, then each other one's suffix attached to it
    ids = stats.bytes - tokens * KV_TOKEN_BYTES  # what the cache counts beside the KV
    assert ids >= tokens * ID_BYTES  # the ids are in the budget...
    whole = ENTRIES * len(prompt(0)) * ID_BYTES
    assert ids < whole // 10  # ...and they are the suffixes' (the whole prompts' would be ~25x more)


def test_adding_and_evicting_an_entry_does_not_rebuild_the_tenants_index() -> None:
    probe = filled()
    cache = filled(max_bytes=probe.stats().bytes)  # exactly full: the next prompt evicts the least recent
    query = prompt(ENTRIES)
    tracemalloc.start()
    try:
        cache.put("a", query, kv(len(query)))  # a new leaf under the root, one old leaf evicted
        n, _ = cache.lookup("a", query)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == len(query)
    assert cache.stats().evictions >= 1
    # a tenth of what a whole index over the tenant's entries takes (entries x prompt length ids); the
    # prompt's ids, its comparisons and the eviction's plan (a few ints an entry, no ids) fit in it
    assert peak < ENTRIES * len(query) * ID_BYTES // 10


def test_the_epoch_is_read_while_the_cache_lock_is_held() -> None:
    cache = filled()
    cache.forget_tenant("b")
    got: list[int] = []
    with cache._lock:  # the engine's thread, inside a long put or lookup
        reader = threading.Thread(target=lambda: got.append(cache.epoch("b")), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert got == [1]  # answered while the lock is still held
    reader.join()
