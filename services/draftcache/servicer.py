"""The DraftCache gRPC service: a thin grpc.aio layer over DraftCacheStore, plus build/serve helpers.

    store, servicer = build(settings)            # restores the snapshot in settings.data_dir if any
    service = await serve(settings, port=0)      # gRPC + health + reflection, periodic snapshots
    ...                                          # service.port; bus.subscribe("draftcache", service.store)
    await service.stop()                         # graceful stop, then a final snapshot

With ``metrics=DraftCacheMetrics.of(registry)`` a ``StoreMeter`` records each Fetch's latency and
keeps the per-tenant trie size gauges current (``service.meter.applier(...)`` for the bus,
``service.meter.refresh_sizes`` as a Refresher job). ``serve`` binds ``settings.host:settings.port``
unless told otherwise.

Blocking work (trie walks, snapshots) runs in a worker thread; errors map to status codes in
services.common.errors (bad input -> INVALID_ARGUMENT, limits -> RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import grpc
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc

from services.common.errors import FailedPrecondition, grpc_errors
from services.common.grpcutil import start_server, stop_server
from services.common.metrics import ConsumerMetrics, DraftCacheMetrics, ObservedApplier
from services.draftcache.fetch import Branch
from services.draftcache.settings import DraftCacheSettings
from services.draftcache.store import DraftCacheStore

log = logging.getLogger(__name__)

SERVICE_NAME: str = draftcache_pb2.DESCRIPTOR.services_by_name["DraftCache"].full_name
CONSUMER = "draftcache"  # logical consumer name in ConsumerMetrics (kafka_settings.DRAFTCACHE_GROUP)


class StoreMeter:
    """DraftCacheMetrics of one store. ``fetch`` and ``add_output`` are the store's, timed or noted;
    trie sizes are never measured per request: a write only marks its tenant, and ``refresh_sizes()``
    (a periodic Refresher job, off the event loop) measures each marked tenant once."""

    def __init__(self, store: DraftCacheStore, metrics: DraftCacheMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self._lock = threading.Lock()
        self._dirty: set[str] = set(store.tenants())  # a restored snapshot: measure everything once
        self._shown: set[str] = set()  # tenants that have gauges

    def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
              reference_ids: Sequence[int] = (), budget: int = 0) -> list[Branch]:
        start = time.perf_counter()
        branches = self.store.fetch(tenant, tokenizer_id, prompt_ids, reference_ids, budget)
        self.metrics.record_fetch(time.perf_counter() - start)
        return branches

    def add_output(self, tenant: str, tokenizer_id: str, output_ids: Sequence[int], event_id: str) -> bool:
        applied = self.store.add_output(tenant, tokenizer_id, output_ids, event_id)
        if applied:
            self.mark(tenant)
        return applied

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
        return ObservedApplier(self.store, CONSUMER, consumer_metrics,
                               on_applied=lambda event: self.mark(event.tenant), on_restore=self.mark_all)


class DraftCacheServicer(draftcache_pb2_grpc.DraftCacheServicer):
    def __init__(self, store: DraftCacheStore, meter: StoreMeter | None = None) -> None:
        self.store = store
        self.meter = meter
        self._calls: StoreMeter | DraftCacheStore = meter or store  # fetch/add_output go through the meter

    @grpc_errors
    async def AddOutput(
        self, request: draftcache_pb2.AddOutputRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.AddOutputResponse:
        applied = await asyncio.to_thread(
            self._calls.add_output, request.tenant, request.tokenizer_id, request.output_ids, request.event_id
        )
        return draftcache_pb2.AddOutputResponse(applied=applied)

    @grpc_errors
    async def Fetch(
        self, request: draftcache_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.FetchResponse:
        branches = await asyncio.to_thread(
            self._calls.fetch,
            request.tenant,
            request.tokenizer_id,
            request.prompt_ids,
            request.reference_ids,
            request.budget,
        )
        return draftcache_pb2.FetchResponse(
            branches=[draftcache_pb2.Branch(ids=b.ids, weight=b.weight) for b in branches],
            tokens=sum(len(b.ids) for b in branches),
        )

    @grpc_errors
    async def Stats(
        self, request: draftcache_pb2.DraftStatsRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.DraftStatsResponse:
        stats = await asyncio.to_thread(self.store.stats, request.tenant)
        return draftcache_pb2.DraftStatsResponse(
            tries=[
                draftcache_pb2.TenantTrieStats(
                    tenant=s.tenant,
                    tokenizer_id=s.tokenizer_id,
                    nodes=s.nodes,
                    bytes=s.bytes,
                    outputs=s.outputs,
                )
                for s in stats
            ]
        )

    @grpc_errors
    async def Snapshot(
        self, request: draftcache_pb2.SnapshotRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.SnapshotResponse:
        path = self.store.settings.snapshot_path()
        if path is None:
            raise FailedPrecondition("draft cache has no data_dir: nothing persists")
        size = await asyncio.to_thread(self.store.save_snapshot, path)
        return draftcache_pb2.SnapshotResponse(path=str(path), bytes=size)


def build(settings: DraftCacheSettings, metrics: DraftCacheMetrics | None = None
          ) -> tuple[DraftCacheStore, DraftCacheServicer]:
    """A store (restored from ``settings.snapshot_path()`` when that file exists) and its servicer
    (metered when ``metrics`` is given: ``servicer.meter``)."""
    store = DraftCacheStore(settings)
    path = settings.snapshot_path()
    if path is not None:
        store.load_snapshot(path)
    return store, DraftCacheServicer(store, None if metrics is None else StoreMeter(store, metrics))


async def save_if_changed(store: DraftCacheStore) -> bool:
    """Write the snapshot when something changed since the last save/load; True when written."""
    path = store.settings.snapshot_path()
    if path is None or store.changes == store.saved_changes:
        return False
    await asyncio.to_thread(store.save_snapshot, path)
    return True


async def _snapshot_every(store: DraftCacheStore, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await save_if_changed(store)
        except Exception:  # a full disk must not stop the service; the next interval retries
            log.exception("periodic draft cache snapshot failed")


@dataclass
class DraftCacheService:
    """A running draft cache: its gRPC server, bound port, store and snapshot task."""

    server: grpc.aio.Server
    port: int
    store: DraftCacheStore
    servicer: DraftCacheServicer
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def meter(self) -> StoreMeter | None:
        return self.servicer.meter

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop (health NOT_SERVING, in-flight calls finish), then a final snapshot."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        grace = self.store.settings.shutdown_grace_s if grace_s is None else grace_s
        await stop_server(self.server, grace_s=grace)
        await save_if_changed(self.store)

    async def wait(self) -> None:
        """Block until the server terminates (the CLI's foreground loop)."""
        await self.server.wait_for_termination()


async def serve(
    settings: DraftCacheSettings,
    port: int | None = None,
    host: str | None = None,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    metrics: DraftCacheMetrics | None = None,
) -> DraftCacheService:
    """Build (restoring the snapshot), start the DraftCache service with health and reflection on
    ``host``:``port`` (default: the settings'; port 0 = any free port)."""
    store, servicer = await asyncio.to_thread(build, settings, metrics)
    server, bound = await start_server(
        [(draftcache_pb2_grpc.add_DraftCacheServicer_to_server, servicer)],
        [SERVICE_NAME],
        port=settings.port if port is None else port,
        host=settings.host if host is None else host,
        interceptors=interceptors,
    )
    task = None
    if settings.snapshot_interval_s > 0 and settings.snapshot_path() is not None:
        task = asyncio.create_task(
            _snapshot_every(store, settings.snapshot_interval_s), name="draftcache-snapshot"
        )
    return DraftCacheService(server, bound, store, servicer, task)
