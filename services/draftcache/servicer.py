"""The DraftCache gRPC service: a thin grpc.aio layer over DraftCacheStore (or its StoreMeter).

Built and served by ``lookahead_rag.services.draftcache.build.build_draftcache``. Blocking work (trie walks,
snapshots) runs in a worker thread; errors map to status codes in services.common.errors (bad
input -> INVALID_ARGUMENT, limits -> RESOURCE_EXHAUSTED); protobuf conversions live in
services.draftcache.convert.
"""

from __future__ import annotations

import asyncio

import grpc

from lookahead_rag.services.common.errors import FailedPrecondition, grpc_errors
from lookahead_rag.services.common.rules.call_quota import CallMeter
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.convert import fetch_response, stats_response
from lookahead_rag.services.draftcache.meter import StoreMeter
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc

SERVICE_NAME: str = draftcache_pb2.DESCRIPTOR.services_by_name["DraftCache"].full_name


class DraftCacheServicer(draftcache_pb2_grpc.DraftCacheServicer):
    def __init__(self, store: DraftCacheStore, meter: StoreMeter | None = None,
                 limits: RequestLimits | None = None) -> None:
        self.store = store
        self.meter = meter
        self._calls: StoreMeter | DraftCacheStore = meter or store  # fetch/add_output go through the meter
        self.limits = limits if limits is not None else RequestLimits()
        self.rate = CallMeter.of(self.limits, SERVICE_NAME)  # each call takes one of its tenant's rate (call_quota.py)

    @grpc_errors
    async def AddOutput(
        self, request: draftcache_pb2.AddOutputRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.AddOutputResponse:
        applied = await self.rate.run("AddOutput", request.tenant, self._calls.add_output, request.tokenizer_id,
                                      request.output_ids, request.event_id)
        return draftcache_pb2.AddOutputResponse(applied=applied)

    @grpc_errors
    async def Fetch(
        self, request: draftcache_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.FetchResponse:
        found = await self.rate.run("Fetch", request.tenant, self._calls.fetch, request.tokenizer_id,
                                    list(request.prompt_ids), list(request.reference_ids), request.budget)
        return fetch_response(found)

    @grpc_errors
    async def Stats(
        self, request: draftcache_pb2.DraftStatsRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.DraftStatsResponse:
        return stats_response(await self.rate.run("Stats", request.tenant, self.store.stats))

    @grpc_errors
    async def Snapshot(
        self, request: draftcache_pb2.SnapshotRequest, context: grpc.aio.ServicerContext
    ) -> draftcache_pb2.SnapshotResponse:
        path = self.store.settings.snapshot_path()
        if path is None:
            raise FailedPrecondition("draft cache has no data_dir: nothing persists")
        size = await asyncio.to_thread(self.store.save_snapshot, path)
        return draftcache_pb2.SnapshotResponse(path=str(path), bytes=size)
