"""``build_draftcache``: the draft cache as one Service (store, servicer, bus subscription, snapshots).

    service = await build_draftcache(settings, limits, bus, registry)   # restores the snapshot if any
    await service.start()                 # periodic snapshots every settings.snapshot_interval_s
    LocalDraftCacheClient(service.meter)  or  await service.serve(port=0)
    await service.stop()                  # server first, then a final snapshot when anything changed

With the bus subscription each applied event marks its tenant; ``meter.refresh_sizes`` (a
Refresher job) keeps the per-tenant trie size gauges current and each Fetch's latency is recorded.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.service import Service
from lookahead_rag.services.draftcache.meter import StoreMeter
from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
from lookahead_rag.services.draftcache.servicer import SERVICE_NAME, DraftCacheServicer
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.metrics import ConsumerMetrics, consumer_jobs
from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP, EventBus
from lookahead_rag.v1 import draftcache_pb2_grpc

log = logging.getLogger(__name__)


class DraftCacheService(Service[DraftCacheStore]):
    """The built draft cache; ``meter`` is the store as seen by metrics (what clients should call)."""

    meter: StoreMeter


def load_store(settings: DraftCacheSettings, limits: RequestLimits) -> DraftCacheStore:
    """A store, restored from ``settings.snapshot_path()`` when that file exists."""
    store = DraftCacheStore(settings, limits)
    path = settings.snapshot_path()
    if path is not None:
        store.load_snapshot(path)
    return store


async def build_draftcache(settings: DraftCacheSettings, limits: RequestLimits, bus: EventBus,
                           registry: CollectorRegistry) -> DraftCacheService:
    store = await asyncio.to_thread(load_store, settings, limits)
    meter = StoreMeter(store, DraftCacheMetrics.of(registry))
    consumers = ConsumerMetrics.of(registry)
    bus.subscribe(DRAFTCACHE_GROUP, meter.applier(consumers))
    service = DraftCacheService(
        "draftcache", store, settings,
        handlers=[(draftcache_pb2_grpc.add_DraftCacheServicer_to_server, DraftCacheServicer(store, meter, limits))],
        service_names=[SERVICE_NAME], max_message_bytes=settings.max_message_bytes,
        jobs=[meter.refresh_sizes, *consumer_jobs(bus, [DRAFTCACHE_GROUP], consumers)],
        closers=[lambda: save_if_changed(store)],
    )
    service.meter = meter
    if settings.snapshot_interval_s > 0 and settings.snapshot_path() is not None:
        service.loops.append(lambda: snapshot_every(store, settings.snapshot_interval_s))
    return service


async def save_if_changed(store: DraftCacheStore) -> bool:
    """Write the snapshot when something changed since the last save/load; True when written."""
    path = store.settings.snapshot_path()
    if path is None or store.changes == store.saved_changes:
        return False
    await asyncio.to_thread(store.save_snapshot, path)
    return True


async def snapshot_every(store: DraftCacheStore, interval_s: float) -> None:
    """Save the snapshot every ``interval_s`` when it changed (until cancelled)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await save_if_changed(store)
        except Exception:  # a full disk must not stop the service; the next interval retries
            log.exception("periodic draft cache snapshot failed")
