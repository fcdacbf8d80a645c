"""The durable outbox: rows survive restarts, leave only when acknowledged, wait out broker outages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lookahead_rag.services.events.kafka.broker import LocalBroker, free_port
from lookahead_rag.services.events.kafka.outbox import Outbox
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.v1 import events_pb2
from tests.builders import completed_events
from tests.kafka.helpers import fast_settings, new_topic, read_topic, require_tansu, run

pytestmark = pytest.mark.timeout(90)


def test_rows_stay_until_removed_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox(path)
    ids = [outbox.append(f"v{i}".encode(), b"acme") for i in range(5)]
    outbox.remove(ids[:2])
    outbox.close()

    reopened = Outbox(path)  # a restarted process finds what was not acknowledged
    rows = reopened.pending(limit=10)
    assert [r.value for r in rows] == [b"v2", b"v3", b"v4"]
    assert [r.key for r in rows] == [b"acme"] * 3
    assert reopened.depth() == 3
    assert [r.id for r in reopened.pending(limit=2)] == ids[2:4]


@pytest.mark.kafka
def test_publisher_delivers_keyed_by_tenant_and_empties_outbox(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    events, topic = completed_events(9), new_topic()

    async def scenario() -> None:
        publisher = KafkaPublisher(fast_settings(broker.bootstrap, topic), tmp_path / "outbox.sqlite3")
        await publisher.start()
        for event in events:
            publisher.publish(event)
        await publisher.flushed(timeout_s=30)
        assert publisher.depth() == 0
        await publisher.stop()
        records = await read_topic(broker.bootstrap, topic, len(events))
        by_id = {e.event_id: e for e in events}
        for record in records:
            event = events_pb2.GenerationCompleted.FromString(record.value)
            assert record.key == by_id[event.event_id].tenant.encode()
        assert {events_pb2.GenerationCompleted.FromString(r.value).event_id for r in records} == set(by_id)
        tenants_per_partition = {r.partition: set() for r in records}
        for r in records:
            tenants_per_partition[r.partition].add(r.key)
        assert sum(len(t) for t in tenants_per_partition.values()) == 3  # one partition per tenant

    run(scenario())


@pytest.mark.kafka
def test_flusher_waits_out_an_unreachable_broker_then_delivers(tmp_path: Path) -> None:
    binary = require_tansu()
    later = LocalBroker(port=free_port(), binary=binary)  # nothing listens there yet
    events, topic = completed_events(4), new_topic()

    async def scenario() -> None:
        publisher = KafkaPublisher(fast_settings(later.bootstrap, topic), tmp_path / "outbox.sqlite3")
        await publisher.start()
        for event in events:
            publisher.publish(event)  # returns at once: the broker is not there
        await asyncio.sleep(0.5)
        assert publisher.depth() == len(events)
        assert publisher.flusher.counters.send_errors >= 1
        later.start()
        try:
            await publisher.flushed(timeout_s=30)
            records = await read_topic(later.bootstrap, topic, len(events))
        finally:
            await publisher.stop()
            later.stop()
        got = sorted(events_pb2.GenerationCompleted.FromString(r.value).event_id for r in records)
        assert got == sorted(e.event_id for e in events)

    run(scenario())


@pytest.mark.kafka
def test_restart_resends_what_was_not_acknowledged(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    events, topic = completed_events(3), new_topic()
    path = tmp_path / "outbox.sqlite3"
    crashed = Outbox(path)  # a process that appended and died before its flusher ran
    for event in events:
        crashed.append(event.SerializeToString(), event.tenant.encode())
    crashed.close()

    async def scenario() -> None:
        publisher = KafkaPublisher(fast_settings(broker.bootstrap, topic), path)
        await publisher.start()
        await publisher.flushed(timeout_s=30)
        await publisher.stop()
        records = await read_topic(broker.bootstrap, topic, len(events))
        got = sorted(events_pb2.GenerationCompleted.FromString(r.value).event_id for r in records)
        assert got == sorted(e.event_id for e in events)

    run(scenario())
