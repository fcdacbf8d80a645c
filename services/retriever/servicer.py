"""The Retriever gRPC service: a thin grpc.aio layer over RetrieverCore.

Built and served by ``lookahead_rag.services.retriever.build`` (``build_retriever``, ``retriever_service``).
Blocking work (embedding, FAISS, tokenization) runs in a worker thread so the event loop stays
responsive. Errors map to status codes in services.common.errors; protobuf conversions live in
services.retriever.convert. Notes about a request and ``unknown_tenant`` are RetrieveResponse fields.
Ingest and Delete go through a ``DocumentWriter``: published as document events (every replica
applies them), and applied here before the reply. Forget goes through a ``ForgetWriter``: one
``ForgetRequested`` event (draft cache, past sessions, generator prefix KV), applied here before the reply.
"""

from __future__ import annotations

import asyncio

import grpc

from lookahead_rag.services.common.errors import grpc_errors
from lookahead_rag.services.common.rules.call_quota import CallMeter
from lookahead_rag.services.retriever.convert import (
    delete_response,
    document_from_proto,
    history_from_proto,
    ingest_response,
    retrieve_response,
    stats_response,
)
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.doc_writer import DocumentWriter
from lookahead_rag.services.retriever.forget import ForgetWriter
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc

SERVICE_NAME: str = retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name


class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
    def __init__(self, core: RetrieverCore, writer: DocumentWriter | None = None,
                 forgetter: ForgetWriter | None = None) -> None:
        """``writer``: how Ingest and Delete change documents, ``forgetter``: how Forget is announced
        (defaults: this replica only, no events)."""
        self.core = core
        self.writer = writer if writer is not None else DocumentWriter(core)
        self.forgetter = forgetter if forgetter is not None else ForgetWriter(core)
        self.meter = CallMeter.of(core.limits, SERVICE_NAME)  # each call takes one of its tenant's rate (call_quota.py)

    @grpc_errors
    async def Ingest(
        self, request: retriever_pb2.IngestRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.IngestResponse:
        self.meter.call("Ingest", request.tenant)  # before its documents are converted
        documents = [document_from_proto(d) for d in request.documents]
        return ingest_response(await asyncio.to_thread(self.writer.ingest, request.tenant, documents))

    @grpc_errors
    async def Delete(
        self, request: retriever_pb2.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.DeleteResponse:
        return delete_response(await self.meter.run("Delete", request.tenant, self.writer.delete,
                                                    list(request.doc_ids)))

    @grpc_errors
    async def Forget(
        self, request: retriever_pb2.ForgetRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.ForgetResponse:
        # a flood of forgets is refused
        event_id = await self.meter.run("Forget", request.tenant, self.forgetter.forget, request.doc_id)
        return retriever_pb2.ForgetResponse(event_id=event_id)

    @grpc_errors
    async def Retrieve(
        self, request: retriever_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.RetrieveResponse:
        self.meter.call("Retrieve", request.tenant)
        self.core.limits.check_messages("history", len(request.history) + 1)  # before its messages are converted
        result = await asyncio.to_thread(
            self.core.retrieve, request.tenant, request.question, request.k, request.m, request.max_new_tokens,
            request.tokenizer_id, history_from_proto(request.history),
        )
        return retrieve_response(result)

    @grpc_errors
    async def Stats(
        self, request: retriever_pb2.RetrieverStatsRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.RetrieverStatsResponse:
        return stats_response(await self.meter.run("Stats", request.tenant, self.core.stats))
