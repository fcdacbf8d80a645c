"""How another service reaches the draft cache: in-process or over gRPC, same protobuf reply.

A failure or a deadline is raised to the caller, which then decodes without the tenant's drafts.
gRPC calls carry the current request id (``x-request-id``) and the service's API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import grpc
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc
from pydantic import SecretStr

from services.common.auth import call_metadata
from services.draftcache.convert import fetch_response
from services.draftcache.fetch import Branch


class Fetcher(Protocol):
    """A DraftCacheStore, or its StoreMeter (which times each fetch)."""

    def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
              reference_ids: Sequence[int] = (), budget: int = 0) -> list[Branch]: ...


class GrpcDraftClient:
    def __init__(self, channel: grpc.aio.Channel, key: SecretStr | str | None = None) -> None:
        """``key``: the API key every call sends (``[auth] service_key``), or none."""
        self.stub = draftcache_pb2_grpc.DraftCacheStub(channel)
        self.key = key

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> draftcache_pb2.FetchResponse:
        req = draftcache_pb2.FetchRequest(tenant=tenant, tokenizer_id=tokenizer_id, prompt_ids=prompt_ids,
                                          reference_ids=reference_ids, budget=budget)
        return await self.stub.Fetch(req, timeout=timeout_s, metadata=call_metadata(self.key))


class LocalDraftClient:
    """Direct calls into a DraftCacheStore in this process (or its StoreMeter)."""

    def __init__(self, store: Fetcher) -> None:
        self.store = store

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> draftcache_pb2.FetchResponse:
        branches = await asyncio.wait_for(
            asyncio.to_thread(self.store.fetch, tenant, tokenizer_id, list(prompt_ids), list(reference_ids), budget),
            timeout_s,
        )
        return fetch_response(branches)
