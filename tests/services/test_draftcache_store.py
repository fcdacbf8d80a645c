"""DraftCacheStore: tenant/tokenizer isolation, idempotency, bounds, bad input, the bus applier."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lookahead_rag.services.common.errors import InvalidArgument, ResourceExhausted
from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events import EventApplier
from lookahead_rag.services.events.inprocess import InProcessBus
from tests.builders import TOKENIZER, completed
from tests.services.draftcache_helpers import small_settings, store_with

A, B = "tenant-a", "tenant-b"
TOK = TOKENIZER


# ---- isolation -----------------------------------------------------------------------------------
def test_tenants_never_mix() -> None:
    # same seed (1, 2) in both tenants, different continuations
    store = store_with([(A, [1, 2, 3, 4]), (B, [1, 2, 99, 98]), (B, [1, 2, 99, 98])])
    assert store.fetch(A, TOKENIZER, [1, 2], [], 20) == [Continuation([1, 2, 3, 4], 1.0)]
    assert store.fetch(B, TOKENIZER, [1, 2], [], 20) == [Continuation([1, 2, 99, 98], 2.0)]


def test_similar_output_of_another_tenant_never_returned_whole() -> None:
    # B's output shares every bigram with the prompt; A's shares none
    store = store_with([(A, [7, 8, 9]), (B, [1, 2, 3, 4, 5])])
    assert store.fetch(A, TOKENIZER, [1, 2, 3, 4, 5], [], 20) == []


def test_tokenizers_never_mix() -> None:
    store = DraftCacheStore(small_settings())
    store.add_output(A, "tok-1", [1, 2, 3], "e1")
    store.add_output(A, "tok-2", [1, 2, 77], "e2")
    assert store.fetch(A, "tok-1", [1, 2], [], 20) == [Continuation([1, 2, 3], 1.0)]
    assert store.fetch(A, "tok-2", [1, 2], [], 20) == [Continuation([1, 2, 77], 1.0)]
    assert [(s.tenant, s.tokenizer_id, s.outputs) for s in store.stats(A)] == [
        (A, "tok-1", 1),
        (A, "tok-2", 1),
    ]


# ---- idempotency ---------------------------------------------------------------------------------
def test_same_event_twice_applied_once() -> None:
    store = DraftCacheStore(small_settings())
    assert store.add_output(A, TOKENIZER, [1, 2, 3], "e1") is True
    before = store.snapshot()
    assert store.add_output(A, TOKENIZER, [1, 2, 3], "e1") is False
    # a replayed event id with different ids is still a duplicate (the id decides)
    assert store.add_output(A, TOKENIZER, [4, 5, 6], "e1") is False
    assert store.snapshot() == before
    assert store.stats(A)[0].outputs == 1
    assert store.fetch(A, TOKENIZER, [1, 2], [], 20) == [Continuation([1, 2, 3], 1.0)]


def test_apply_is_the_event_applier() -> None:
    store = DraftCacheStore(small_settings())
    assert isinstance(store, EventApplier)
    assert store.apply(completed(A, event_id="e1", output_ids=[1, 2, 3])) is True
    assert store.apply(completed(A, event_id="e1", output_ids=[1, 2, 3])) is False
    assert store.fetch(A, TOKENIZER, [1, 2], [], 20) == [Continuation([1, 2, 3], 1.0)]


def test_in_process_bus_feeds_the_store() -> None:
    store = DraftCacheStore(small_settings())

    async def main() -> None:
        bus = InProcessBus()
        bus.subscribe("draftcache", store)
        await bus.start()
        for event in [
            completed(A, event_id="e1", output_ids=[1, 2, 3]),
            completed(A, event_id="e1", output_ids=[1, 2, 3]),
            completed(B, event_id="e2", output_ids=[1, 2, 9]),
        ]:
            bus.publish(event)
        await bus.drain(timeout_s=10)
        counters = bus.counters("draftcache")
        await bus.stop()
        assert (counters.applied, counters.duplicates) == (2, 1)

    asyncio.run(main())
    assert store.fetch(A, TOKENIZER, [1, 2], [], 20) == [Continuation([1, 2, 3], 1.0)]


def test_concurrent_duplicate_adds_apply_each_event_once() -> None:
    store = DraftCacheStore(small_settings())
    events = [(f"e{i}", [i % 5, i % 7, i % 3]) for i in range(300)]
    applied: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for event_id, ids in events:
            result = store.add_output(A, TOKENIZER, ids, event_id)
            with lock:
                applied.append(result)
            store.fetch(A, TOKENIZER, ids, [], 20)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(applied) == len(events)
    assert store.stats(A)[0].outputs == len(events)


# ---- bounds --------------------------------------------------------------------------------------
def test_capacity_bound_holds() -> None:
    capacity = 40
    store = DraftCacheStore(small_settings(node_capacity=capacity, max_references=5))
    # a frequent output first: pruning removes the least frequent nodes, so it stays
    for i in range(30):
        store.add_output(A, TOKENIZER, [60, 61, 62], f"hot{i}")
    rng = random.Random(7)
    for i in range(200):
        store.add_output(A, TOKENIZER, [rng.randrange(50) for _ in range(10)], f"e{i}")
        stats = store.stats(A)[0]
        assert stats.nodes <= capacity
        assert stats.references <= 5
    assert stats.outputs == 230
    assert Continuation([60, 61, 62], 30.0) in store.fetch(A, TOKENIZER, [60, 61], [], 64)


def test_recent_output_comes_back_whole_when_the_trie_is_full() -> None:
    # the trie is full of frequent unigrams, so a new output's windows are pruned at once (least
    # frequent); the whole-output store still returns it for a similar prompt
    capacity = 40
    store = DraftCacheStore(small_settings(node_capacity=capacity))
    rng = random.Random(7)
    for i in range(200):
        store.add_output(A, TOKENIZER, [rng.randrange(50) for _ in range(10)], f"e{i}")
    store.add_output(A, TOKENIZER, [70, 71, 72, 73, 74], "new")
    assert store.fetch(A, TOKENIZER, [70, 71, 72], [], 64)[0] == Continuation([70, 71, 72, 73, 74], 1.0)


def test_references_keep_the_most_recent() -> None:
    outputs = [(A, [1, 2, 3, 4]), (A, [5, 6, 7, 8]), (A, [9, 10, 11, 12])]
    store = store_with(outputs, small_settings(max_references=2))
    assert store.stats(A)[0].references == 2
    # the oldest is no longer returned whole (a whole output starts at its first token); the trie
    # still continues the prompt's bigrams
    assert store.fetch(A, TOK, [2, 3, 4], [], 64) == [Continuation([2, 3, 4], 1.0)]
    # the most recent is
    assert store.fetch(A, TOK, [10, 11, 12], [], 64) == [Continuation([9, 10, 11, 12], 1.0)]


def test_event_id_memory_is_bounded_per_tenant() -> None:
    store = store_with([(A, [1, 2]) for _ in range(4)], small_settings(max_event_ids=3))
    assert store.add_output(A, TOKENIZER, [1, 2], "e3") is False  # still remembered
    assert store.add_output(A, TOKENIZER, [1, 2], "e0") is True  # forgotten (oldest), applied again


def test_reference_tokens_are_cut() -> None:
    store = store_with([(A, list(range(1, 30)))], small_settings(max_reference_tokens=6, max_chain_tokens=2))
    whole = store.fetch(A, TOKENIZER, [1, 2, 3], [], 64)[0]
    assert whole == Continuation([1, 2, 3, 4, 5, 6], 1.0)


# ---- bad input -----------------------------------------------------------------------------------
HUGE = 2**31  # one past the largest token id

BAD_CALLS: list[tuple[str, Callable[[DraftCacheStore], Any], str]] = [
    # empty tenant
    ("fetch empty tenant", lambda s: s.fetch("", TOK, [1], [], 0), "tenant is empty"),
    # empty tokenizer id
    ("add empty tokenizer", lambda s: s.add_output(A, "", [1], "e"), "tokenizer_id must not be empty"),
    # empty event id (idempotency needs one)
    ("add empty event id", lambda s: s.add_output(A, TOK, [1], ""), "event_id must not be empty"),
    # over-long tenant
    ("long tenant", lambda s: s.fetch("x" * 300, TOK, [1], [], 0), "tenant is 300 characters; the limit is 128"),
    # budget over the maximum (64 in SMALL)
    ("budget over max", lambda s: s.fetch(A, TOK, [1], [], 65), "budget 65 is out of range"),
    # negative budget
    ("negative budget", lambda s: s.fetch(A, TOK, [1], [], -1), "budget -1 is out of range"),
    # too many ids (256 in SMALL), prompt and references together
    ("too many ids", lambda s: s.fetch(A, TOK, [1] * 200, [1] * 57, 0), "has 257 ids; at most 256"),
    # too many output ids
    ("long output", lambda s: s.add_output(A, TOK, [1] * 257, "e"), "output_ids has 257 ids"),
    # a token id past 2^31 - 1
    ("huge id", lambda s: s.fetch(A, TOK, [1, HUGE], [], 0), "prompt_ids[1] = 2147483648 is not a token id"),
    # a negative token id
    ("negative id", lambda s: s.add_output(A, TOK, [3, -1], "e"), "output_ids[1] = -1 is not a token id"),
    # a huge id in the references
    ("huge ref id", lambda s: s.fetch(A, TOK, [1], [HUGE], 0), "reference_ids[0] = 2147483648"),
]


@pytest.mark.parametrize(("name", "call", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input(name: str, call: Callable[[DraftCacheStore], Any], message: str) -> None:
    store = store_with([(A, [1, 2, 3])])
    before = store.snapshot()
    with pytest.raises(InvalidArgument) as info:
        call(store)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert store.snapshot() == before


def test_tenant_limit() -> None:
    store = store_with([(A, [1]), (B, [2])], small_settings(max_tenants=2))
    # a new tenant past the limit is applied; the least recently used (A) is evicted for it
    # (the rest of eviction: tests/services/test_draftcache_eviction.py)
    assert store.add_output("tenant-c", TOKENIZER, [3], "e9") is True
    assert store.tenants() == sorted([B, "tenant-c"])


def test_tokenizer_limit() -> None:
    store = store_with([(A, [1])], small_settings(max_tokenizers_per_tenant=1))
    with pytest.raises(ResourceExhausted, match="max_tokenizers_per_tenant"):
        store.add_output(A, "tok-2", [3], "e9")
    # a refused event is not remembered: it applies once the limit allows
    assert store.add_output(A, TOKENIZER, [3], "e9") is True
