"""The bus reports its own stats (``EventBus.stats()``), and the consumer and outbox metrics follow them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.events import (
    DRAFTCACHE_GROUP,
    RETRIEVER_GROUP,
    BusStats,
    ConsumerCounters,
    EventBus,
    OutboxStats,
)
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.metrics import ConsumerMetrics, OutboxMetrics, consumer_jobs, outbox_job
from tests.builders import completed_events
from tests.kafka.helpers import RecordingApplier, fast_settings, new_topic, run

DRAIN_S = 30.0
GROUPS = (DRAFTCACHE_GROUP, RETRIEVER_GROUP)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"lookahead_rag_{name}", labels)


def sample_metrics(bus: EventBus, registry: CollectorRegistry) -> None:
    """One Refresher round of the jobs app.py and serve.py schedule for a bus."""
    for job in [*consumer_jobs(bus, GROUPS, ConsumerMetrics.of(registry)), outbox_job(bus, OutboxMetrics.of(registry))]:
        job()


def test_bus_totals_become_counters_by_delta_and_survive_a_restarted_count() -> None:
    registry = CollectorRegistry()
    consumer, outbox = ConsumerMetrics.of(registry), OutboxMetrics.of(registry)

    def sample(name: str) -> float | None:
        return registry.get_sample_value(f"lookahead_rag_consumer_{name}", {"consumer": "retriever"})

    consumer.observe_counters("retriever", ConsumerCounters())
    assert sample("applied_events_total") == 0 and sample("dead_lettered_events_total") == 0  # exported at once
    consumer.observe_counters("retriever", ConsumerCounters(applied=5, duplicates=2, redelivered=1, lag=3))
    consumer.observe_counters("retriever", ConsumerCounters(applied=7, duplicates=2, redelivered=1,
                                                            dead_lettered=1, apply_errors=3, lag=0))
    assert (sample("applied_events_total"), sample("redelivered_events_total"), sample("replayed_records_total"),
            sample("apply_errors_total"), sample("dead_lettered_events_total"), sample("lag_events")) == (
        7, 2, 1, 3, 1, 0)
    consumer.observe_counters("retriever", ConsumerCounters(applied=4))  # the bus restarted its count
    assert sample("applied_events_total") == 11
    outbox.observe_sent_total(3)
    outbox.observe_sent_total(5)
    outbox.observe_sent_total(1)
    assert registry.get_sample_value("lookahead_rag_outbox_sent_events_total") == 6


def test_in_process_bus_stats_count_each_group_and_have_no_outbox() -> None:
    events = completed_events(4)
    poison = events[2].event_id
    registry = CollectorRegistry()

    async def scenario() -> tuple[BusStats, BusStats]:
        bus = InProcessBus(max_attempts=2)
        bus.subscribe(DRAFTCACHE_GROUP, RecordingApplier())
        bus.subscribe(RETRIEVER_GROUP, RecordingApplier(fail_ids=frozenset({poison})))
        queued_before_start = bus.stats()  # nothing applied yet, everything still queued
        for event in events:
            bus.publish(event)
        pending = bus.stats()
        await bus.start()
        bus.publish(events[0])  # a duplicate
        await bus.drain(timeout_s=DRAIN_S)
        sample_metrics(bus, registry)
        await bus.stop()
        assert queued_before_start == BusStats({group: ConsumerCounters() for group in GROUPS}, None)
        assert pending.consumers[DRAFTCACHE_GROUP].lag == len(events)
        return pending, bus.stats()

    pending, done = asyncio.run(scenario())
    assert done.outbox is None
    assert done.consumers == {
        DRAFTCACHE_GROUP: ConsumerCounters(applied=4, duplicates=1),
        RETRIEVER_GROUP: ConsumerCounters(applied=3, duplicates=1, dead_lettered=1, apply_errors=2),
    }
    assert pending.consumers[DRAFTCACHE_GROUP].applied == 0  # a copy: later counting does not reach it
    assert value(registry, "consumer_applied_events_total", consumer=DRAFTCACHE_GROUP) == 4
    assert value(registry, "consumer_dead_lettered_events_total", consumer=RETRIEVER_GROUP) == 1
    assert value(registry, "consumer_lag_events", consumer=RETRIEVER_GROUP) == 0
    assert (value(registry, "outbox_depth"), value(registry, "outbox_sent_events_total")) == (0, 0)  # untouched


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_kafka_bus_stats_count_each_group_and_the_outbox(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic())
    events = completed_events(5)
    registry = CollectorRegistry()

    async def scenario() -> None:
        bus = KafkaBus(settings, tmp_path)
        for group in GROUPS:
            bus.subscribe(group, RecordingApplier())
        assert bus.stats() == BusStats({group: ConsumerCounters() for group in GROUPS}, None)  # nothing opened
        assert not settings.resolved_outbox_path(tmp_path).exists()  # a metrics read opens no outbox
        await bus.start()
        for event in events:
            bus.publish(event)
        await bus.drain(timeout_s=DRAIN_S)
        stats = bus.stats()
        sample_metrics(bus, registry)
        await bus.stop()
        assert stats.outbox == OutboxStats(depth=0, sent=len(events))
        for group in GROUPS:
            assert (stats.consumers[group].applied, stats.consumers[group].lag) == (len(events), 0), group
        assert bus.stats().outbox is None  # stopped: the outbox is closed

    run(scenario())
    assert (value(registry, "outbox_depth"), value(registry, "outbox_sent_events_total")) == (0, len(events))
    for group in GROUPS:
        assert value(registry, "consumer_applied_events_total", consumer=group) == len(events), group
        assert value(registry, "consumer_lag_events", consumer=group) == 0, group
