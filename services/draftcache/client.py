"""How another service reaches the draft cache: in-process or over gRPC, same domain reply (the store's
``Continuation`` list; over gRPC read back from the wire by ``convert.continuations_from_proto``).

Both are a ``DraftCacheClient`` (``lookahead_rag.services.generator.clients``). A failure or a deadline is raised
to the caller, which then decodes without the tenant's drafts. gRPC calls carry the current request
id (``x-request-id``) and the service's API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from pydantic import SecretStr

from lookahead_rag.services.common.auth.callers import call_metadata
from lookahead_rag.services.draftcache.convert import continuations_from_proto
from lookahead_rag.services.draftcache.fetch import Continuation, Fetcher
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc


class GrpcDraftCacheClient:
    def __init__(self, channel: grpc.aio.Channel, key: SecretStr | str | None = None) -> None:
        """``key``: the API key every call sends (``[auth] service_key``), or none."""
        self.stub = draftcache_pb2_grpc.DraftCacheStub(channel)
        self.key = key

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> list[Continuation]:
        req = draftcache_pb2.FetchRequest(tenant=tenant, tokenizer_id=tokenizer_id, prompt_ids=prompt_ids,
                                          reference_ids=reference_ids, budget=budget)
        return continuations_from_proto(await self.stub.Fetch(req, timeout=timeout_s, metadata=call_metadata(self.key)))


class LocalDraftCacheClient:
    """Direct calls into a DraftCacheStore in this process (or its StoreMeter): what its servicer answers."""

    def __init__(self, store: Fetcher) -> None:
        self.store = store

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> list[Continuation]:
        return await asyncio.wait_for(
            asyncio.to_thread(self.store.fetch, tenant, tokenizer_id, list(prompt_ids), list(reference_ids), budget),
            timeout_s,
        )
