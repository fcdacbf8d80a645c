"""The draft cache's metrics: trie size per tenant, Fetch latency and tenant evictions."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.telemetry.metric_group import LATENCY_BUCKETS, MetricGroup


class DraftCacheMetrics(MetricGroup):
    """Trie size per tenant, Fetch latency and tenants evicted past max_tenants."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.trie_nodes = self.gauge("draftcache_trie_nodes", "trie nodes held per tenant", ("tenant",))
        self.trie_bytes = self.gauge("draftcache_trie_bytes", "approx. trie bytes per tenant", ("tenant",))
        self.fetch_latency = self.histogram(
            "draftcache_fetch_latency_seconds", "time to assemble one Fetch's continuations", LATENCY_BUCKETS
        )
        self.tenant_evictions = self.counter(
            "draftcache_tenant_evictions", "tenants evicted (least recently used) to stay within max_tenants"
        )

    def set_tenant_size(self, tenant: str, nodes: int, nbytes: int) -> None:
        self.trie_nodes.labels(tenant).set(nodes)
        self.trie_bytes.labels(tenant).set(nbytes)

    def forget_tenant(self, tenant: str) -> None:
        for gauge in (self.trie_nodes, self.trie_bytes):
            with contextlib.suppress(KeyError):
                gauge.remove(tenant)

    def record_fetch(self, seconds: float) -> None:
        self.fetch_latency.observe(seconds)

    def record_eviction(self) -> None:
        self.tenant_evictions.inc()
