"""``PrefixForgets``: the generator's EventApplier; a ``ForgetRequested`` drops the tenant's prefix KV.

    forgets = subscribe_forgets(bus, registry)       # before bus.start(): every replica reads every forget
    ...
    forgets.attach(engine.scheduler.forgets_to())   # once the engine exists

A forget of one document drops *all* of the tenant's prefix KV: a cached prefix is the KV of a prompt,
and any prompt may hold the document's text (a retrieved chunk) or a past answer grounded on it; the
cache does not know which, and the next prompts simply prefill again. ``forget_tenant`` also advances
the tenant's epoch, so a request whose prompt was built before the forget does not store its KV
afterwards (``PrefixKVCache.put``).

The prefix cache lives in memory only: a restarted generator starts empty, so the snapshot holds only
the applied forget ids (a replay after a restart applies nothing twice), kept per tenant so that one
tenant's flood of forgets pushes out only its own (``lookahead_rag.services.events.tenant_ids``; a snapshot of bare
ids, saved before, still loads). ``GenerationCompleted``
events on the same stream concern the generator not at all: they are handled by doing nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from lookahead_rag.services.events.forget import MAX_FORGET_IDS, MAX_TENANT_FORGET_IDS
from lookahead_rag.services.events.metrics import ConsumerMetrics, ObservedApplier, consumer_jobs
from lookahead_rag.services.events.protocols import GENERATOR_GROUP, EventBus
from lookahead_rag.services.events.streams import GENERATIONS
from lookahead_rag.services.events.tenant_ids import TenantIds
from lookahead_rag.v1 import events_pb2

log = logging.getLogger(__name__)


class TenantForgettable(Protocol):
    """What a forget reaches: ``lookahead_core.kv.prefix_cache.PrefixKVCache`` (torch-free here)."""

    def forget_tenant(self, tenant: str) -> int: ...


class PrefixForgets:
    """Applies forgets to every attached prefix cache; idempotent by event id. Thread-safe."""

    def __init__(self, max_event_ids: int = MAX_FORGET_IDS, tenant_event_ids: int = MAX_TENANT_FORGET_IDS) -> None:
        self.max_event_ids = max_event_ids
        self.tenant_event_ids = tenant_event_ids
        self._caches: list[TenantForgettable] = []
        self._applied = TenantIds(tenant_event_ids, max_event_ids)  # forget event ids per tenant, oldest first
        self._lock = threading.Lock()

    def attach(self, cache: TenantForgettable) -> None:
        """Forget in ``cache`` too from now on (it starts empty: earlier forgets have nothing to drop)."""
        with self._lock:
            self._caches.append(cache)

    def apply(self, event: events_pb2.GenerationCompleted | events_pb2.ForgetRequested) -> bool:
        """Drop the forget's tenant from every cache; False when this forget was applied before."""
        if not isinstance(event, events_pb2.ForgetRequested):
            return True  # an answer: nothing of the generator's state derives from it
        if not event.event_id or not event.tenant:
            raise ValueError("ForgetRequested without event_id or tenant")
        with self._lock:
            if not self._applied.add(event.tenant, event.event_id):
                return False
            caches = list(self._caches)
        dropped = sum(cache.forget_tenant(event.tenant) for cache in caches)
        log.info("forgot %d prefix KV entries of tenant %r (%s)", dropped, event.tenant,
                 f"document {event.doc_id!r}: all of the tenant's" if event.doc_id else "all")
        return True

    def snapshot(self) -> bytes:
        with self._lock:
            return json.dumps({"applied": self._applied.to_json()}).encode()

    def restore(self, data: bytes) -> None:
        """Replace the applied ids with a snapshot's (``[tenant, id]`` pairs, or bare ids saved before)."""
        try:
            items = json.loads(data or b"{}").get("applied", [])
            applied = TenantIds.from_json(items, self.tenant_event_ids, self.max_event_ids)
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed generator forget snapshot: {exc}") from exc
        with self._lock:
            self._applied = applied


def subscribe_forgets(bus: EventBus, registry: CollectorRegistry) -> tuple[PrefixForgets, list[Callable[[], None]]]:
    """Subscribe a PrefixForgets as the generator's group, every replica reading every forget (call
    before ``bus.start()``); returns it and its metric jobs (for a Refresher)."""
    forgets = PrefixForgets()
    consumers = ConsumerMetrics.of(registry)
    bus.subscribe(GENERATOR_GROUP, ObservedApplier(forgets, GENERATOR_GROUP, consumers), stream=GENERATIONS,
                  every_replica=True)
    return forgets, consumer_jobs(bus, [GENERATOR_GROUP], consumers)
