"""``StoreMeter``: a DraftCacheStore seen by metrics (fetch latency, per-tenant trie size gauges, evictions)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.metrics import ConsumerMetrics, ObservedApplier
from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP


class StoreMeter:
    """DraftCacheMetrics of one store. ``fetch`` and ``add_output`` are the store's, timed or noted;
    trie sizes are never measured per request: a write only marks its tenant, and ``refresh_sizes()``
    (a periodic Refresher job, off the event loop) measures each marked tenant once. Each tenant the
    store evicts is counted and marked, so its gauges go at the next refresh."""

    def __init__(self, store: DraftCacheStore, metrics: DraftCacheMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self._lock = threading.Lock()
        self._dirty: set[str] = set(store.tenants())  # a restored snapshot: measure everything once
        self._shown: set[str] = set()  # tenants that have gauges
        store.add_eviction_listener(self._evicted)

    def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
              reference_ids: Sequence[int] = (), budget: int = 0) -> list[Continuation]:
        start = time.perf_counter()
        continuations = self.store.fetch(tenant, tokenizer_id, prompt_ids, reference_ids, budget)
        self.metrics.record_fetch(time.perf_counter() - start)
        return continuations

    def add_output(self, tenant: str, tokenizer_id: str, output_ids: Sequence[int], event_id: str) -> bool:
        applied = self.store.add_output(tenant, tokenizer_id, output_ids, event_id)
        if applied:
            self.mark(tenant)
        return applied

    def _evicted(self, tenant: str) -> None:
        """The store evicted ``tenant``: count it; its gauges go at the next refresh."""
        self.metrics.record_eviction()
        self.mark(tenant)

    def mark(self, tenant: str) -> None:
        """``tenant``'s tries changed: measure it at the next refresh."""
        with self._lock:
            self._dirty.add(tenant)

    def mark_all(self) -> None:
        """The whole state was replaced (a restore): measure every tenant, drop vanished ones."""
        with self._lock:
            self._dirty.update(self.store.tenants(), self._shown)

    def refresh_sizes(self) -> int:
        """Set the size gauges of the tenants marked since the last call; returns how many."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for tenant in sorted(dirty):
            scopes = self.store.stats(tenant)  # walks this tenant's tries under its lock (fetches of it wait)
            with self._lock:
                if scopes:
                    self.metrics.set_tenant_size(tenant, sum(s.nodes for s in scopes), sum(s.bytes for s in scopes))
                    self._shown.add(tenant)
                else:
                    self.metrics.forget_tenant(tenant)
                    self._shown.discard(tenant)
        return len(dirty)

    def applier(self, consumer_metrics: ConsumerMetrics) -> ObservedApplier:
        """The store as the bus's EventApplier: event age recorded, applied tenants marked."""
        return ObservedApplier(self.store, DRAFTCACHE_GROUP, consumer_metrics,
                               on_applied=lambda event: self.mark(event.tenant), on_restore=self.mark_all)
