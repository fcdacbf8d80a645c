"""Protobuf <-> retriever domain types, in one place: the servicer and both clients use these.

    response = retrieve_response(core.retrieve("acme", "How do I write JSON?"))   # the servicer's reply
    result = retrieve_result(response)                                            # the gRPC client's answer
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lookahead_rag.services.common.rules.conversation import Message
from lookahead_rag.services.retriever.core import DeleteResult, IngestResult, RetrieveResult, RetrieverStats
from lookahead_rag.services.retriever.documents import ChunkRecord, Document, ScoredChunk
from lookahead_rag.services.retriever.sessions import ScoredSession, SessionRecord
from lookahead_rag.v1 import retriever_pb2


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """One message of a conversation before the question (``services.common.rules.conversation.Message``)."""

    role: str  # system | developer | user | assistant (checked by the core)
    content: str  # its text


def history_from_proto(messages: Iterable[retriever_pb2.HistoryMessage]) -> tuple[HistoryMessage, ...]:
    return tuple(HistoryMessage(m.role, m.content) for m in messages)


def history_to_proto(messages: Sequence[Message]) -> list[retriever_pb2.HistoryMessage]:
    return [retriever_pb2.HistoryMessage(role=m.role, content=m.content) for m in messages]


def chunk_to_proto(found: ScoredChunk) -> retriever_pb2.Chunk:
    c = found.chunk
    return retriever_pb2.Chunk(
        chunk_id=c.chunk_id, doc_id=c.doc_id, title=c.title, text=c.text, source=c.source,
        start=c.start, end=c.end, score=found.score,
    )


def session_to_proto(found: ScoredSession) -> retriever_pb2.PastSession:
    s = found.session
    return retriever_pb2.PastSession(question=s.question, answer=s.answer, score=found.score, event_id=s.event_id)


def chunk_from_proto(chunk: retriever_pb2.Chunk) -> ScoredChunk:
    record = ChunkRecord(chunk_id=chunk.chunk_id, doc_id=chunk.doc_id, title=chunk.title, text=chunk.text,
                         source=chunk.source, start=chunk.start, end=chunk.end)
    return ScoredChunk(record, chunk.score)


def session_from_proto(past: retriever_pb2.PastSession) -> ScoredSession:
    # the wire carries no creation time nor doc ids: a past session's reader needs neither
    return ScoredSession(SessionRecord(past.event_id, past.question, past.answer, created_unix_ms=0), past.score)


def document_from_proto(doc: retriever_pb2.Document) -> Document:
    return Document(id=doc.id, title=doc.title or doc.id, text=doc.text, source=doc.source)


def retrieve_response(result: RetrieveResult) -> retriever_pb2.RetrieveResponse:
    return retriever_pb2.RetrieveResponse(
        chunks=[chunk_to_proto(c) for c in result.chunks],
        sessions=[session_to_proto(s) for s in result.sessions],
        prompt=result.prompt,
        prompt_ids=result.prompt_ids,
        tokenizer_id=result.tokenizer_id,
        retrieve_ms=result.retrieve_ms,
        notes=result.notes,
        unknown_tenant=result.unknown_tenant,
        history_turns_kept=result.history_turns_kept,
    )


def retrieve_result(response: retriever_pb2.RetrieveResponse) -> RetrieveResult:
    """The reply of a Retrieve over the wire, as the core returned it (its prompt token ``budget`` is not
    sent: 0)."""
    return RetrieveResult(
        chunks=[chunk_from_proto(c) for c in response.chunks],
        sessions=[session_from_proto(s) for s in response.sessions],
        prompt=response.prompt, prompt_ids=list(response.prompt_ids), tokenizer_id=response.tokenizer_id,
        retrieve_ms=response.retrieve_ms, notes=list(response.notes), unknown_tenant=response.unknown_tenant,
        history_turns_kept=response.history_turns_kept,
    )


def ingest_response(result: IngestResult) -> retriever_pb2.IngestResponse:
    return retriever_pb2.IngestResponse(
        documents=result.documents, chunks=result.chunks, total_chunks=result.total_chunks
    )


def delete_response(result: DeleteResult) -> retriever_pb2.DeleteResponse:
    return retriever_pb2.DeleteResponse(documents=result.documents, total_chunks=result.total_chunks)


def stats_response(stats: RetrieverStats) -> retriever_pb2.RetrieverStatsResponse:
    return retriever_pb2.RetrieverStatsResponse(chunks=stats.chunks, sessions=stats.sessions, tenants=stats.tenants,
                                                model=stats.model, tokenizer_id=stats.tokenizer_id)
