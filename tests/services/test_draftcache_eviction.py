"""Tenant eviction: past max_tenants the least recently used tenant (by fetch or add) makes room.

Tiny hand-made token lists: cap 2, tenants a and b, a used again, c added -> b goes; the eviction
is counted and logged, c's output is applied (never refused), b starts afresh, and no snapshot
taken after the eviction brings b back.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.draftcache.meter import StoreMeter
from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
from lookahead_rag.services.draftcache.store import DraftCacheStore
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings

A, B, C = "tenant-a", "tenant-b", "tenant-c"
CAP = 2  # max_tenants in these tests
OUTPUT = [1, 2, 3]  # every tenant's one output; the seed [1, 2] finds it
SEED = [1, 2]
FOUND = [Continuation(OUTPUT, 1.0)]  # what a fetch of SEED returns for a tenant holding OUTPUT
BUDGET = 20
EVICTIONS = "lookahead_rag_draftcache_tenant_evictions_total"
TRIE_NODES = "lookahead_rag_draftcache_trie_nodes"


def find(store: DraftCacheStore | StoreMeter, tenant: str) -> list[Continuation]:
    return store.fetch(tenant, TOKENIZER, SEED, [], BUDGET)


def evicted_b() -> tuple[DraftCacheStore, StoreMeter, CollectorRegistry]:
    """Cap 2: a and b added, a fetched (so b is the least recently used), then c added."""
    store = DraftCacheStore(small_settings(max_tenants=CAP))
    registry = CollectorRegistry()
    meter = StoreMeter(store, DraftCacheMetrics.of(registry))
    assert meter.add_output(A, TOKENIZER, OUTPUT, "a1") is True
    assert meter.add_output(B, TOKENIZER, OUTPUT, "b1") is True
    assert meter.fetch(A, TOKENIZER, SEED, [], BUDGET) == FOUND  # a is now the most recently used
    assert meter.add_output(C, TOKENIZER, OUTPUT, "c1") is True  # applied: c is never refused
    return store, meter, registry


def test_least_recently_used_tenant_is_evicted_and_counted() -> None:
    store, _, registry = evicted_b()
    # b was used last before a's fetch: it goes, a and c stay
    assert store.tenants() == [A, C]
    # one eviction, counted by the Prometheus counter and the store
    assert registry.get_sample_value(EVICTIONS) == 1
    assert store.evictions == 1
    # the new tenant's output is there
    assert find(store, C) == FOUND


@pytest.mark.parametrize(("ids", "event_id", "applied"), [
    ([4, 5], "a2", True),  # a new output of a
    (OUTPUT, "a1", False),  # a redelivered event: nothing applied, still a use of a
])
def test_an_add_counts_as_use_even_redelivered(ids: list[int], event_id: str, applied: bool) -> None:
    store = DraftCacheStore(small_settings(max_tenants=CAP))
    store.add_output(A, TOKENIZER, OUTPUT, "a1")
    store.add_output(B, TOKENIZER, OUTPUT, "b1")
    assert store.add_output(A, TOKENIZER, ids, event_id) is applied  # a used again by an add
    store.add_output(C, TOKENIZER, OUTPUT, "c1")
    # b, not a (the first one added), is evicted
    assert store.tenants() == [A, C]


def test_fetch_of_an_unknown_tenant_creates_nothing() -> None:
    store = DraftCacheStore(small_settings(max_tenants=CAP))
    store.add_output(A, TOKENIZER, OUTPUT, "a1")
    store.add_output(B, TOKENIZER, OUTPUT, "b1")
    # a fetch of a tenant the store does not hold neither creates nor evicts one
    assert find(store, C) == []
    assert store.tenants() == [A, B] and store.evictions == 0


def test_evicted_tenant_starts_afresh() -> None:
    store, meter, registry = evicted_b()
    # its later fetch finds nothing
    assert find(store, B) == []
    # and its event ids went with it: its old event applies again (it is a new tenant now)
    assert meter.add_output(B, TOKENIZER, OUTPUT, "b1") is True
    assert find(store, B) == FOUND
    # which evicted a (c was added after a's fetch): the second eviction
    assert store.tenants() == [B, C]
    assert registry.get_sample_value(EVICTIONS) == 2


def test_evicted_tenant_loses_its_size_gauges() -> None:
    _, meter, registry = evicted_b()
    meter.refresh_sizes()
    # the tenants held have gauges, the evicted one none (the tenant label stays bounded by max_tenants)
    assert registry.get_sample_value(TRIE_NODES, {"tenant": A})
    assert registry.get_sample_value(TRIE_NODES, {"tenant": C})
    assert registry.get_sample_value(TRIE_NODES, {"tenant": B}) is None


def test_gauge_shown_before_the_eviction_is_removed() -> None:
    store = DraftCacheStore(small_settings(max_tenants=1))
    registry = CollectorRegistry()
    meter = StoreMeter(store, DraftCacheMetrics.of(registry))
    meter.add_output(A, TOKENIZER, OUTPUT, "a1")
    meter.refresh_sizes()
    assert registry.get_sample_value(TRIE_NODES, {"tenant": A})
    meter.add_output(B, TOKENIZER, OUTPUT, "b1")  # cap 1: a goes
    meter.refresh_sizes()
    # a's gauge is removed at the next refresh
    assert registry.get_sample_value(TRIE_NODES, {"tenant": A}) is None


def test_eviction_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lookahead_rag.services.draftcache.store"):
        evicted_b()
    lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    # one line, naming the evicted tenant and the cap
    assert len(lines) == 1 and repr(B) in lines[0] and f"max_tenants={CAP}" in lines[0]


def test_snapshot_after_eviction_does_not_bring_the_tenant_back(tmp_path: Path) -> None:
    store = DraftCacheStore(small_settings(tmp_path, max_tenants=CAP))
    path = tmp_path / "draftcache.snapshot"
    store.add_output(A, TOKENIZER, OUTPUT, "a1")
    store.add_output(B, TOKENIZER, OUTPUT, "b1")
    store.save_snapshot(path)  # a file that still holds b
    find(store, A)
    store.add_output(C, TOKENIZER, OUTPUT, "c1")
    # the eviction counts as a change, so the next save (periodic or at stop) rewrites the file
    assert store.changes != store.saved_changes
    store.save_snapshot(path)
    restored = DraftCacheStore(small_settings(tmp_path, max_tenants=CAP))
    assert restored.load_snapshot(path)
    # b is not in the file written after its eviction
    assert restored.tenants() == [A, C]
    assert find(restored, B) == [] and find(restored, C) == FOUND


def test_restore_keeps_the_use_order() -> None:
    store, _, _ = evicted_b()  # use order: a (fetched), then c (added)
    restored = DraftCacheStore(small_settings(max_tenants=CAP))
    restored.restore(store.snapshot())
    restored.add_output(B, TOKENIZER, OUTPUT, "b2")
    # a, the least recently used before the snapshot, is the one a restored store evicts first
    assert restored.tenants() == [B, C]


def test_restore_of_a_bigger_snapshot_evicts_down_to_the_cap() -> None:
    big = DraftCacheStore(small_settings(max_tenants=3))
    for tenant in (A, B, C):
        big.add_output(tenant, TOKENIZER, OUTPUT, f"{tenant}-1")
    small = DraftCacheStore(small_settings(max_tenants=CAP))
    evicted: list[str] = []
    small.add_eviction_listener(evicted.append)
    small.restore(big.snapshot())
    # max_tenants was lowered since the snapshot: the least recently used tenant goes, listeners hear it
    assert small.tenants() == [B, C] and evicted == [A]
