"""How the generator reaches the retriever and the draft cache: in-process or over gRPC.

Both kinds return the same protobuf messages, so the engine does not care which it has.
A failure or a deadline is raised to the engine, which then answers without that part. gRPC calls
carry the current request id (``x-request-id``), so the other services log under the same id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import grpc
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc, retriever_pb2, retriever_pb2_grpc

from services.common.errors import InvalidArgument
from services.common.logging import outgoing_metadata

# (response, notes): notes are the retriever's remarks, e.g. "tenant 'x' has no documents"
Retrieved = tuple[retriever_pb2.RetrieveResponse, list[str]]


class RetrieverClient(Protocol):
    async def retrieve(
        self, tenant: str, question: str, k: int, m: int, max_new_tokens: int, timeout_s: float
    ) -> Retrieved: ...


class DraftClient(Protocol):
    async def fetch(
        self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int], reference_ids: Sequence[int],
        budget: int, timeout_s: float,
    ) -> draftcache_pb2.FetchResponse: ...


def _reraise_bad_input(err: grpc.aio.AioRpcError) -> None:
    """The caller's own bad input stays an error; anything else means 'part unavailable'."""
    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
        raise InvalidArgument(err.details() or "invalid argument") from err


class GrpcRetrieverClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = retriever_pb2_grpc.RetrieverStub(channel)

    async def retrieve(self, tenant: str, question: str, k: int, m: int, max_new_tokens: int,
                       timeout_s: float) -> Retrieved:
        from services.retriever.servicer import notes_from_metadata

        req = retriever_pb2.RetrieveRequest(tenant=tenant, question=question, k=k, m=m,
                                            max_new_tokens=max_new_tokens)
        try:
            call = self.stub.Retrieve(req, timeout=timeout_s, metadata=outgoing_metadata())
            response = await call
            return response, notes_from_metadata(await call.trailing_metadata())
        except grpc.aio.AioRpcError as err:
            _reraise_bad_input(err)
            raise


class GrpcDraftClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = draftcache_pb2_grpc.DraftCacheStub(channel)

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> draftcache_pb2.FetchResponse:
        req = draftcache_pb2.FetchRequest(tenant=tenant, tokenizer_id=tokenizer_id, prompt_ids=prompt_ids,
                                          reference_ids=reference_ids, budget=budget)
        return await self.stub.Fetch(req, timeout=timeout_s, metadata=outgoing_metadata())


class LocalRetrieverClient:
    """Direct calls into a RetrieverCore in this process (the embedded default)."""

    def __init__(self, core: object) -> None:
        self.core = core

    async def retrieve(self, tenant: str, question: str, k: int, m: int, max_new_tokens: int,
                       timeout_s: float) -> Retrieved:
        from services.retriever.servicer import chunk_to_proto, session_to_proto

        result = await asyncio.wait_for(
            asyncio.to_thread(self.core.retrieve, tenant, question, k, m, max_new_tokens),  # type: ignore[attr-defined]
            timeout_s,
        )
        return retriever_pb2.RetrieveResponse(
            chunks=[chunk_to_proto(c) for c in result.chunks],
            sessions=[session_to_proto(s) for s in result.sessions],
            prompt=result.prompt, prompt_ids=result.prompt_ids, tokenizer_id=result.tokenizer_id,
            retrieve_ms=result.retrieve_ms,
        ), list(result.notes)


class LocalDraftClient:
    """Direct calls into a DraftCacheStore in this process (or its StoreMeter, which times each fetch)."""

    def __init__(self, store: object) -> None:
        self.store = store

    async def fetch(self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int],
                    reference_ids: Sequence[int], budget: int, timeout_s: float) -> draftcache_pb2.FetchResponse:
        branches = await asyncio.wait_for(
            asyncio.to_thread(self.store.fetch, tenant, tokenizer_id, list(prompt_ids),  # type: ignore[attr-defined]
                              list(reference_ids), budget),
            timeout_s,
        )
        return draftcache_pb2.FetchResponse(
            branches=[draftcache_pb2.Branch(ids=b.ids, weight=b.weight) for b in branches],
            tokens=sum(len(b.ids) for b in branches),
        )
