"""Issue 51, fourth hostile pass, the event bus: one large document never blocks the documents outbox
(finding 2), the documents topic is compacted wherever topics are created (finding 8), and the draft
cache keeps every AddOutput across a graceful restart with Kafka on (finding 10)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.settings import ConfigError
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.draftcache.build import DraftCacheService, build_draftcache
from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.outbox import FlusherConfig, Outbox, OutboxFlusher
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.topics import topic_configs
from lookahead_rag.services.events.streams import DOCUMENTS
from lookahead_rag.v1 import events_pb2
from tests.builders import TOKENIZER, completed
from tests.kafka.helpers import deliver, fast_settings, new_topic, read_topic, run
from tests.services.deploy_helpers import compose_topics, job_topics
from tests.services.draftcache_helpers import small_settings

pytestmark = pytest.mark.timeout(180)
kafka = pytest.mark.kafka
LARGE_CHARS = 1_200_000  # a 1.2 MB document: over aiokafka's 1 MiB default max_request_size
OLD_DEFAULT_BYTES = 1024 * 1024  # aiokafka's default max_request_size: this test's record limit
FLUSH_S = 15.0  # far longer than a flush of two rows takes
TENANT = "acme"
ANSWER = [11, 12, 13, 14]  # a bus event's output
DIRECT = [21, 22, 23, 24]  # an AddOutput's
PROD_ONLY = {"min.insync.replicas"}  # the Job's production settings beside the code's configurations


def document(doc_id: str, chars: int) -> events_pb2.DocumentChanged:
    return events_pb2.DocumentChanged(event_id=f"ev-{doc_id}", tenant=TENANT, doc_id=doc_id, version="v1",
                                      title=doc_id, text="x" * chars, created_unix_ms=1)


def documents_publisher(settings: KafkaSettings, tmp_path: Path) -> KafkaPublisher:
    return KafkaPublisher(settings.model_copy(update={"topic": new_topic()}), tmp_path / "outbox.sqlite3",
                          stream=DOCUMENTS)


async def published_doc_ids(publisher: KafkaPublisher, bootstrap: str, count: int) -> list[str]:
    records = await read_topic(bootstrap, publisher.settings.topic, count)
    return [json.loads(record.key)[1] for record in records]


# --- finding 2: a large document and the outbox ---------------------------------------------------------


def set_aside_rows(outbox: Outbox) -> list[tuple[bytes, str]]:
    """(key, reason) of each row set aside, oldest first, read as an operator would (sqlite3)."""
    with sqlite3.connect(outbox.path) as db:
        return [(bytes(k), str(r)) for k, r in db.execute("SELECT key, reason FROM outbox_set_aside ORDER BY id")]


@kafka
def test_a_large_document_then_a_small_one_both_reach_kafka(broker: LocalBroker, tmp_path: Path) -> None:
    publisher = documents_publisher(fast_settings(broker.bootstrap, "unused"), tmp_path)

    async def scenario() -> None:
        await publisher.start()
        try:
            publisher.publish(document("big", LARGE_CHARS))
            publisher.publish(document("small", 10))
            await publisher.flushed(FLUSH_S)  # before: the big row failed every round, nothing was sent
        finally:
            await publisher.stop()
        assert sorted(await published_doc_ids(publisher, broker.bootstrap, 2)) == ["big", "small"]

    run(scenario())


@kafka
def test_an_event_over_the_record_limit_is_set_aside_and_every_event_behind_it_is_delivered(
    broker: LocalBroker, tmp_path: Path
) -> None:
    settings = fast_settings(broker.bootstrap, "unused", max_record_bytes=OLD_DEFAULT_BYTES)
    publisher = documents_publisher(settings, tmp_path)

    async def scenario() -> None:
        await publisher.start()
        try:
            publisher.publish(document("big", LARGE_CHARS))
            publisher.publish(document("small", 10))
            await publisher.flushed(FLUSH_S)
            stats = publisher.stats()
            (key, reason), = set_aside_rows(publisher.outbox)
        finally:
            await publisher.stop()
        assert await published_doc_ids(publisher, broker.bootstrap, 1) == ["small"]
        assert (stats.depth, stats.sent, stats.set_aside) == (0, 1, 1)
        assert json.loads(key)[1] == "big" and "MessageSizeTooLarge" in reason

    run(scenario())


class BatchRefusingProducer:
    """A producer whose broker refuses, as too large, every round holding a row over ``limit`` bytes
    (the whole batch, as Kafka refuses a batch): a broker whose max.message.bytes is below the producer's."""

    def __init__(self, limit: int, delivered: list[bytes]) -> None:
        self.limit = limit
        self.delivered = delivered
        self._round: list[tuple[bytes, asyncio.Future[object]]] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None
                   ) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._round.append((value, future))
        asyncio.get_running_loop().call_soon(self._answer)
        return future

    def _answer(self) -> None:
        sent, self._round = self._round, []
        refused = any(len(value) > self.limit for value, _ in sent)
        for value, future in sent:
            if refused:
                future.set_exception(MessageSizeTooLargeError("batch too large"))
            else:
                self.delivered.append(value)
                future.set_result(None)


def test_a_broker_refusing_a_shared_batch_sets_aside_only_the_large_row(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite3", "NORMAL")
    delivered: list[bytes] = []
    config = FlusherConfig(batch_size=10, poll_interval_s=0.05, send_timeout_s=5.0, backoff_s=0.01,
                           backoff_max_s=0.05, stop_timeout_s=1.0)
    flusher = OutboxFlusher(outbox, "t", lambda: BatchRefusingProducer(100, delivered), config)  # type: ignore[arg-type,return-value]
    rows = [b"a", b"B" * 1000, b"c", b"d"]

    async def scenario() -> None:
        for i, value in enumerate(rows):
            outbox.append(value, f"key-{i}".encode())
        await flusher.start()
        try:
            await flusher.flushed(FLUSH_S)
        finally:
            await flusher.stop()

    run(scenario())
    assert delivered == [b"a", b"c", b"d"]
    assert [key for key, _ in set_aside_rows(outbox)] == [b"key-1"]
    assert flusher.counters.set_aside == 1


def test_serve_refuses_documents_the_bus_cannot_carry() -> None:
    on = {"bootstrap_servers": "127.0.0.1:9092"}
    AllSettings.load(kafka=on)  # the defaults fit: the largest document event is below max_record_bytes
    with pytest.raises(ConfigError, match=r"max_record_bytes.*max_doc_chars"):
        AllSettings.load(kafka=on, retriever={"max_doc_chars": 10_000_000})
    AllSettings.load(retriever={"max_doc_chars": 10_000_000})  # the in-process bus has no record limit


# --- finding 8: the documents topic is compacted everywhere --------------------------------------------


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_topic_configs_agree_with_the_code_and_compact_the_documents(where: str) -> None:
    created = compose_topics() if where == "compose" else job_topics()
    expected = topic_configs(KafkaSettings())
    assert set(created) == set(expected)
    for topic, configs in expected.items():
        extra = {k: v for k, v in created[topic].configs.items() if k not in PROD_ONLY}
        assert extra == configs, topic
    documents = expected[KafkaSettings().documents_topic]
    assert documents["cleanup.policy"] == "compact" and "retention.ms" not in documents


# --- finding 10: AddOutput across a graceful restart -----------------------------------------------------


@kafka
def test_add_output_is_kept_across_a_graceful_restart_with_kafka(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), snapshot_every_events=1)
    cache_settings = small_settings(tmp_path / "draftcache", snapshot_interval_s=0)

    async def start() -> tuple[KafkaBus, DraftCacheService]:
        bus = KafkaBus(settings, tmp_path / "bus")
        service = await build_draftcache(cache_settings, RequestLimits(), bus, CollectorRegistry())
        await bus.start()
        return bus, service

    async def stop(bus: KafkaBus, service: DraftCacheService) -> None:  # the Pipeline's order: bus, then the closers
        await bus.stop()
        await service.close()

    async def scenario() -> None:
        bus, service = await start()
        # an answer from the bus: the consumer saves its snapshot + offsets right after it
        await deliver(bus, [completed(TENANT, event_id="e1", prompt_ids=[1, 2], output_ids=ANSWER)])
        assert service.meter.add_output(TENANT, TOKENIZER, DIRECT, "direct-1")
        await stop(bus, service)

        bus, service = await start()
        await bus.drain(FLUSH_S)
        store = service.core
        try:
            assert store.fetch(TENANT, TOKENIZER, [21, 22], [], 20) == [Continuation(DIRECT, 1.0)]
            assert store.fetch(TENANT, TOKENIZER, [11, 12], [], 20) == [Continuation(ANSWER, 1.0)]
        finally:
            await stop(bus, service)

    run(scenario())
