"""Prometheus metric groups: each group's metrics defined once, registered once per CollectorRegistry.

A service process uses the default registry; tests and ``serve all`` may pass their own so that
in-process instances do not collide::

    registry = CollectorRegistry()                       # or None: prometheus_client.REGISTRY
    GeneratorMetrics.of(registry).record_answer(new_tokens=128, forward_steps=40, ...)

Groups live with what they measure: ``common.observability`` (gRPC calls), ``http.metrics`` (HTTP
requests), ``generator.metrics`` (with ``RequestMetrics``: vLLM's request metrics under our prefix,
e.g. ``lookahead_rag_e2e_request_latency_seconds``), ``draftcache.metrics`` and ``events.metrics``
(consumers and the outbox). Names start with ``lookahead_rag_``; docs/OBSERVABILITY.md lists them.
Tenant appears as a label only on the draft cache's size gauges (bounded by its max_tenants
setting); nothing else is labelled by request data.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Self

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

NS = "lookahead_rag"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_GROUPS: weakref.WeakKeyDictionary[CollectorRegistry, dict[type, Any]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


class MetricGroup:
    """A set of metrics registered once per registry; ``Group.of(registry)`` returns that one set."""

    @classmethod
    def of(cls, registry: CollectorRegistry | None = None) -> Self:
        registry = REGISTRY if registry is None else registry
        with _GROUPS_LOCK:
            groups = _GROUPS.setdefault(registry, {})
            if cls not in groups:
                groups[cls] = cls(registry)
            return groups[cls]

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), namespace=NS, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), namespace=NS, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
                  ) -> Histogram:
        return Histogram(name, doc, list(labels), namespace=NS, registry=self.registry, buckets=buckets)
