"""The Retriever gRPC service: a thin grpc.aio layer over RetrieverCore.

    server, port = await serve(core, port=0)     # default: core.settings.host / .port
    ...
    await stop_server(server, grace_s=5.0)

Blocking work (embedding, FAISS, tokenization) runs in a worker thread so the event loop stays
responsive. Errors map to status codes in services.common.errors. Notes about a request (unknown
tenant, items left out for the token budget) travel as trailing metadata ``lar-note``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import grpc
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc

from services.common.errors import grpc_errors
from services.common.grpcutil import DEFAULT_MAX_MESSAGE_BYTES, start_server
from services.retriever.core import RetrieverCore
from services.retriever.documents import Document, ScoredChunk
from services.retriever.sessions import ScoredSession

SERVICE_NAME: str = retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name
NOTE_METADATA_KEY = "lar-note"  # trailing metadata: one entry per note, JSON string (ASCII-safe)


def chunk_to_proto(found: ScoredChunk) -> retriever_pb2.Chunk:
    c = found.chunk
    return retriever_pb2.Chunk(
        chunk_id=c.chunk_id,
        doc_id=c.doc_id,
        title=c.title,
        text=c.text,
        source=c.source,
        start=c.start,
        end=c.end,
        score=found.score,
    )


def session_to_proto(found: ScoredSession) -> retriever_pb2.PastSession:
    s = found.session
    return retriever_pb2.PastSession(question=s.question, answer=s.answer, score=found.score, event_id=s.event_id)


def document_from_proto(doc: retriever_pb2.Document) -> Document:
    return Document(id=doc.id, title=doc.title or doc.id, text=doc.text, source=doc.source)


class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
    def __init__(self, core: RetrieverCore) -> None:
        self.core = core

    @grpc_errors
    async def Ingest(
        self, request: retriever_pb2.IngestRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.IngestResponse:
        documents = [document_from_proto(d) for d in request.documents]
        result = await asyncio.to_thread(self.core.ingest, request.tenant, documents)
        return retriever_pb2.IngestResponse(
            documents=result.documents, chunks=result.chunks, total_chunks=result.total_chunks
        )

    @grpc_errors
    async def Retrieve(
        self, request: retriever_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.RetrieveResponse:
        result = await asyncio.to_thread(
            self.core.retrieve, request.tenant, request.question, request.k, request.m, request.max_new_tokens
        )
        if result.notes:
            context.set_trailing_metadata(tuple((NOTE_METADATA_KEY, json.dumps(n)) for n in result.notes))
        return retriever_pb2.RetrieveResponse(
            chunks=[chunk_to_proto(c) for c in result.chunks],
            sessions=[session_to_proto(s) for s in result.sessions],
            prompt=result.prompt,
            prompt_ids=result.prompt_ids,
            tokenizer_id=result.tokenizer_id,
            retrieve_ms=result.retrieve_ms,
        )

    @grpc_errors
    async def Stats(
        self, request: retriever_pb2.RetrieverStatsRequest, context: grpc.aio.ServicerContext
    ) -> retriever_pb2.RetrieverStatsResponse:
        stats = await asyncio.to_thread(self.core.stats, request.tenant)
        return retriever_pb2.RetrieverStatsResponse(chunks=stats.chunks, sessions=stats.sessions, tenants=stats.tenants)


async def serve(
    core: RetrieverCore,
    port: int | None = None,
    host: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """Start the Retriever service (with health and reflection) on ``host``:``port`` (default: the
    core's settings; port 0 = any free port); returns (server, bound port)."""
    return await start_server(
        [(retriever_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(core))],
        [SERVICE_NAME],
        port=core.settings.port if port is None else port,
        host=core.settings.host if host is None else host,
        max_message_bytes=max_message_bytes,
        interceptors=interceptors,
    )


def notes_from_metadata(metadata: object) -> list[str]:
    """Decode the ``lar-note`` trailing metadata of a Retrieve call (client side)."""
    if not metadata:
        return []
    return [json.loads(value) for key, value in metadata if key == NOTE_METADATA_KEY]  # type: ignore[attr-defined]
