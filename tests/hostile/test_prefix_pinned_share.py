"""Issue 46, finding 1: a heavy tenant whose own bytes are pinned cannot flush a lighter tenant's prefixes.

At the default share (``prefix_cache_tenant_share = 1.0``: one tenant may fill the whole cache when alone)
the cache is full with B's 30-token prompt and A's 50-token prompt. A then sends a prompt that continues
its own 50 tokens by 30 more: the new entry attaches to A's entry, so both are pinned (a parent stays
while its children do). The only evictable bytes are B's, and B holds less than A: the cache must refuse
A's new entry rather than flush B, and keep everything that was there.
"""

from __future__ import annotations

import torch
from lookahead_core.kv.prefix_cache import KV, PrefixCacheConfig, PrefixKVCache

from lookahead_rag.services.generator.settings import GeneratorSettings

LAYERS, HEADS, DIM = 2, 1, 4  # a hand-made KV: [1, HEADS, n, DIM] per layer
B_PROMPT = list(range(1000, 1030))  # B: 30 tokens
A_ROOT = list(range(2000, 2050))  # A: 50 tokens
A_MORE = A_ROOT + list(range(3000, 3030))  # A again: its 50 tokens, then 30 more attached to them
MIN_TOKENS = 16  # the generator's default prefix_min_tokens


def kv(n: int) -> KV:
    return [(torch.zeros(1, HEADS, n, DIM), torch.zeros(1, HEADS, n, DIM)) for _ in range(LAYERS)]


def full_cache(share: float) -> PrefixKVCache:
    """A cache holding B's 30 tokens and A's 50, with exactly that many bytes of room."""
    probe = PrefixKVCache(PrefixCacheConfig(max_bytes=1 << 30, min_tokens=MIN_TOKENS, tenant_share=share))
    probe.put("b", B_PROMPT, kv(len(B_PROMPT)))
    probe.put("a", A_ROOT, kv(len(A_ROOT)))
    cache = PrefixKVCache(PrefixCacheConfig(max_bytes=probe.stats().bytes, min_tokens=MIN_TOKENS,
                                            tenant_share=share))
    cache.put("b", B_PROMPT, kv(len(B_PROMPT)))
    cache.put("a", A_ROOT, kv(len(A_ROOT)))
    assert cache.stats().bytes == probe.stats().bytes  # full to the byte
    return cache


def test_a_pinned_heavy_tenant_is_refused_rather_than_flushing_a_lighter_one() -> None:
    share = GeneratorSettings().prefix_cache_tenant_share
    assert share == 1.0  # the shipped default, which the earlier hostile test (share 0.25) did not run at
    cache = full_cache(share)
    before = cache.stats()
    cache.put("a", A_MORE, kv(len(A_MORE)))  # 30 more tokens attached to A's own (pinned) 50
    # B keeps its entry, and its next lookup reuses all of it
    assert cache.sequences("b") == [tuple(B_PROMPT)]
    assert cache.lookup("b", B_PROMPT)[0] == len(B_PROMPT)
    # A's new entry was refused; A keeps what it had, and nothing was evicted for it
    assert cache.sequences("a") == [tuple(A_ROOT)]
    after = cache.stats()
    assert (after.entries, after.bytes, after.evictions) == (before.entries, before.bytes, 0)
