"""Ingest and Delete over gRPC on the in-process bus (the embedded default): they publish document
events, apply them before replying, and Retrieve sees the result."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.events.protocols import RETRIEVER_DOCUMENTS_GROUP, RETRIEVER_GROUP
from lookahead_rag.services.events.streams import DOCUMENTS
from lookahead_rag.services.retriever.build import wire_retriever
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.v1 import events_pb2, retriever_pb2, retriever_pb2_grpc
from tests.services.retriever_helpers import settings, shared_embedder, shared_tokenizer

TENANT = "acme"
DOCS = [
    retriever_pb2.Document(id="json.dumps", title="json.dumps(obj)", text="Serialize obj to a JSON formatted str."),
    retriever_pb2.Document(id="csv.reader", title="csv.reader(f)", text="Return a reader over lines of a CSV file."),
]
QUESTION = "How do I write JSON?"
DRAIN_S = 10.0
Scenario = Callable[[retriever_pb2_grpc.RetrieverStub, InProcessBus], Awaitable[None]]


class Recorder:
    """An applier that keeps the types of the events it is given."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def apply(self, event: Any) -> bool:
        self.seen.append(type(event).__name__)
        return True

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        pass


def run_retriever(scenario: Scenario) -> None:
    """A fresh in-memory retriever wired to a fresh in-process bus, served on a free port."""

    async def main() -> None:
        core = RetrieverCore(settings(), embedder=shared_embedder(), tokenizer=shared_tokenizer())
        bus = InProcessBus()
        service = wire_retriever(core, bus, CollectorRegistry())
        await bus.start()
        port = await service.serve(port=0)
        try:
            async with open_channel(f"127.0.0.1:{port}") as channel:
                await scenario(retriever_pb2_grpc.RetrieverStub(channel), bus)
        finally:
            await service.stop_serving(grace_s=1.0)
            await bus.stop()
            await service.close()

    asyncio.run(main())


async def found_docs(stub: retriever_pb2_grpc.RetrieverStub) -> set[str]:
    reply = await stub.Retrieve(retriever_pb2.RetrieveRequest(tenant=TENANT, question=QUESTION, k=5))
    return {chunk.doc_id for chunk in reply.chunks}


def test_ingest_then_delete_change_what_retrieve_finds() -> None:
    async def scenario(stub: retriever_pb2_grpc.RetrieverStub, bus: InProcessBus) -> None:
        reply = await stub.Ingest(retriever_pb2.IngestRequest(tenant=TENANT, documents=DOCS))
        assert (reply.documents, reply.chunks, reply.total_chunks) == (2, 2, 2)
        # read-your-writes: applied before the reply, no drain needed
        assert await found_docs(stub) == {"json.dumps", "csv.reader"}
        # both events went through the bus; the local copy already held them, so they changed nothing
        await bus.drain(DRAIN_S)
        counters = bus.counters(RETRIEVER_DOCUMENTS_GROUP)
        assert (counters.applied, counters.duplicates, counters.dead_lettered) == (0, 2, 0)

        deleted = await stub.Delete(retriever_pb2.DeleteRequest(tenant=TENANT, doc_ids=["json.dumps", "nope"]))
        assert (deleted.documents, deleted.total_chunks) == (1, 1)  # "nope" was never held: skipped
        # the deleted document's chunks are gone from the index, not just hidden
        assert await found_docs(stub) == {"csv.reader"}

    run_retriever(scenario)


def test_bad_input_is_refused_before_anything_is_published() -> None:
    async def scenario(stub: retriever_pb2_grpc.RetrieverStub, bus: InProcessBus) -> None:
        seen = Recorder()
        bus.subscribe("observer", seen, stream=DOCUMENTS)
        empty_text = retriever_pb2.Document(id="x", text="  ")
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: stub.Ingest(retriever_pb2.IngestRequest(tenant=TENANT, documents=[*DOCS, empty_text])),
            lambda: stub.Delete(retriever_pb2.DeleteRequest(tenant=TENANT, doc_ids=[])),
            lambda: stub.Delete(retriever_pb2.DeleteRequest(tenant=TENANT, doc_ids=["json.dumps", " "])),
        ]
        for call in calls:
            # INVALID_ARGUMENT, and the valid documents of the same request were not published either
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await bus.drain(DRAIN_S)
        assert seen.seen == []

    run_retriever(scenario)


def test_the_in_process_bus_gives_each_subscriber_only_its_streams_events() -> None:
    async def scenario(stub: retriever_pb2_grpc.RetrieverStub, bus: InProcessBus) -> None:
        answers, documents = Recorder(), Recorder()
        bus.subscribe("answers", answers)
        bus.subscribe("documents", documents, stream=DOCUMENTS)
        await stub.Ingest(retriever_pb2.IngestRequest(tenant=TENANT, documents=DOCS[:1]))
        bus.publish(events_pb2.GenerationCompleted(event_id="g1", tenant=TENANT, question="q", answer_text="a"))
        await bus.drain(DRAIN_S)
        # a subscriber of one stream never receives the other's events (nor fails decoding them)
        assert (answers.seen, documents.seen) == (["GenerationCompleted"], ["DocumentChanged"])
        assert bus.counters(RETRIEVER_GROUP).applied == 1  # the past session reached the retriever too

    run_retriever(scenario)
