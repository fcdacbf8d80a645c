"""Retriever replicas on the real (bundled tansu) broker: documents and past sessions reach every
replica, a new replica with an empty data dir catches up from the log, a restarted one resumes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.service import Service
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import RETRIEVER_DOCUMENTS_GROUP
from lookahead_rag.services.retriever.build import wire_retriever
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc
from tests.builders import completed
from tests.kafka.helpers import fast_settings, new_topic, run
from tests.services.retriever_helpers import settings, shared_embedder, shared_tokenizer

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
DRAIN_S = 30.0
TENANT = "acme"
QUESTION = "How do I write JSON?"
DOCS = [
    retriever_pb2.Document(id="json.dumps", title="json.dumps(obj)", text="Serialize obj to a JSON formatted str."),
    retriever_pb2.Document(id="csv.reader", title="csv.reader(f)", text="Return a reader over lines of a CSV file."),
]


@dataclass
class Replica:
    core: RetrieverCore
    bus: KafkaBus
    service: Service[RetrieverCore]
    port: int

    async def found(self) -> set[str]:
        """Doc ids a Retrieve on this replica returns (over gRPC)."""
        reply = await self.call(lambda s: s.Retrieve(retriever_pb2.RetrieveRequest(tenant=TENANT, question=QUESTION)))
        return {chunk.doc_id for chunk in reply.chunks}

    async def call(self, rpc):  # type: ignore[no-untyped-def]
        async with open_channel(f"127.0.0.1:{self.port}") as channel:
            return await rpc(retriever_pb2_grpc.RetrieverStub(channel))

    async def stop(self) -> None:
        await self.service.stop_serving(grace_s=1.0)
        await self.bus.stop()
        await self.service.close()


async def start_replica(kafka: KafkaSettings, data_dir: Path, replica_id: str) -> Replica:
    """One retriever replica: its own data dir, its own replica id, the shared topics."""
    core = RetrieverCore(settings(data_dir / "retriever"), embedder=shared_embedder(), tokenizer=shared_tokenizer())
    bus = KafkaBus(kafka.model_copy(update={"replica_id": replica_id}), data_dir / "bus")
    service = wire_retriever(core, bus, CollectorRegistry())
    await bus.start()
    await service.start()
    return Replica(core, bus, service, await service.serve(port=0))


async def settle(*replicas: Replica) -> None:
    """Every outbox sent, then every replica caught up with both topics."""
    for replica in replicas:
        await replica.bus.drain(DRAIN_S)
    for replica in replicas:
        await replica.bus.drain(DRAIN_S)


def test_documents_and_past_sessions_reach_every_replica(broker: LocalBroker, tmp_path: Path) -> None:
    kafka = fast_settings(broker.bootstrap, new_topic(), documents_topic=new_topic())

    async def scenario() -> None:
        a = await start_replica(kafka, tmp_path / "a", "a")
        b = await start_replica(kafka, tmp_path / "b", "b")
        c: Replica | None = None
        try:
            await a.call(lambda s: s.Ingest(retriever_pb2.IngestRequest(tenant=TENANT, documents=DOCS)))
            a.bus.publish(completed(TENANT, question="How do I write JSON?", answer="json.dumps(obj)"))
            await settle(a, b)
            # ingested through a, retrieved through b
            assert await b.found() == {"json.dumps", "csv.reader"}
            # the finished answer is one record in one partition: a shared group would give it to one
            # replica only, each replica reading every partition gives it to both
            assert (a.core.sessions.count(TENANT), b.core.sessions.count(TENANT)) == (1, 1)

            # a new replica with an empty data dir reads both topics from the beginning
            c = await start_replica(kafka, tmp_path / "c", "c")
            await settle(a, b, c)
            assert await c.found() == {"json.dumps", "csv.reader"}
            assert c.core.sessions.count(TENANT) == 1

            # a delete through one reaches the others
            reply = await b.call(lambda s: s.Delete(retriever_pb2.DeleteRequest(tenant=TENANT, doc_ids=["json.dumps"])))
            assert reply.documents == 1
            await settle(a, b, c)
            assert (await a.found(), await c.found()) == ({"csv.reader"}, {"csv.reader"})
        finally:
            for replica in (a, b, c):
                if replica is not None:
                    await replica.stop()

        # a restarted replica restores its indexes from its data dir and resumes after its saved
        # offsets: it reads nothing again (a stale snapshot would have made it re-read the whole log)
        a = await start_replica(kafka, tmp_path / "a", "a")
        try:
            await settle(a)
            assert await a.found() == {"csv.reader"}
            counters = a.bus.counters(RETRIEVER_DOCUMENTS_GROUP)
            assert (counters.applied, counters.duplicates, counters.redelivered) == (0, 0, 0)
        finally:
            await a.stop()

    run(scenario())
