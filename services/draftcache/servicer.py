"""The DraftCache gRPC service: a thin grpc.aio layer over DraftCacheStore, plus build/serve helpers.

    store, servicer = build(settings)            # restores the snapshot in settings.data_dir if any
    service = await serve(settings, port=0)      # gRPC + health + reflection, periodic snapshots
    ...                                          # service.port; bus.subscribe("draftcache", service.store)
    await service.stop()                         # graceful stop, then a final snapshot

Blocking work (trie walks, snapshots) runs in a worker thread; errors map to status codes in
services.common.errors (bad input -> INVALID_ARGUMENT, limits -> RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc

from services.common.errors import FailedPrecondition, grpc_errors
from services.common.grpcutil import DEFAULT_HOST, start_server, stop_server
from services.draftcache.settings import DraftCacheSettings
from services.draftcache.store import DraftCacheStore

log = logging.getLogger(__name__)

SERVICE_NAME: str = draftcache_pb2.DESCRIPTOR.services_by_name["DraftCache"].full_name


class DraftCacheServicer(draftcache_pb2_grpc.DraftCacheServicer):
    def __init__(self, store: DraftCacheStore) -> None:
        self.store = store

    @grpc_errors
    async def AddOutput(
        self, request: draftcache_pb2.AddOutputRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.AddOutputResponse:
        applied = await asyncio.to_thread(
            self.store.add_output, request.tenant, request.tokenizer_id, request.output_ids, request.event_id
        )
        return draftcache_pb2.AddOutputResponse(applied=applied)

    @grpc_errors
    async def Fetch(
        self, request: draftcache_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.FetchResponse:
        branches = await asyncio.to_thread(
            self.store.fetch,
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


def build(settings: DraftCacheSettings) -> tuple[DraftCacheStore, DraftCacheServicer]:
    """A store (restored from ``settings.snapshot_path()`` when that file exists) and its servicer."""
    store = DraftCacheStore(settings)
    path = settings.snapshot_path()
    if path is not None:
        store.load_snapshot(path)
    return store, DraftCacheServicer(store)


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


async def serve(settings: DraftCacheSettings, port: int = 0, host: str = DEFAULT_HOST) -> DraftCacheService:
    """Build (restoring the snapshot), start the DraftCache service with health and reflection."""
    store, servicer = await asyncio.to_thread(build, settings)
    server, bound = await start_server(
        [(draftcache_pb2_grpc.add_DraftCacheServicer_to_server, servicer)],
        [SERVICE_NAME],
        port=port,
        host=host,
    )
    task = None
    if settings.snapshot_interval_s > 0 and settings.snapshot_path() is not None:
        task = asyncio.create_task(
            _snapshot_every(store, settings.snapshot_interval_s), name="draftcache-snapshot"
        )
    return DraftCacheService(server, bound, store, servicer, task)
