"""The Kafka bus on the bundled broker: fan-out to every group, tenant order, resume after a stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead_rag.services.events import DRAFTCACHE_GROUP, RETRIEVER_GROUP
from lookahead_rag.services.events.factory import make_bus
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from tests.builders import completed_events
from tests.kafka.helpers import RecordingApplier, deliver, expected_by_tenant, fast_settings, new_topic, run, started

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
DRAIN_S = 30.0


def test_an_event_reaches_the_draft_cache_and_the_retriever(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic())
    draft, sessions = RecordingApplier(), RecordingApplier()
    events = completed_events(1)

    async def scenario() -> None:
        bus = make_bus(settings, tmp_path)
        assert isinstance(bus, KafkaBus)
        await started(bus, {DRAFTCACHE_GROUP: draft, RETRIEVER_GROUP: sessions})
        await deliver(bus, events, DRAIN_S)
        assert bus.counters(DRAFTCACHE_GROUP).applied == 1
        assert bus.counters(RETRIEVER_GROUP).applied == 1
        await bus.stop()

    run(scenario())
    assert draft.by_tenant == sessions.by_tenant == expected_by_tenant(events)


def test_two_groups_see_every_event_and_each_tenant_in_order(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic())
    first, second = RecordingApplier(), RecordingApplier()
    events = completed_events(60)

    async def scenario() -> None:
        bus = await started(KafkaBus(settings, tmp_path), {"first": first, "second": second})
        await deliver(bus, events, DRAIN_S)
        await bus.stop()

    run(scenario())
    assert first.by_tenant == expected_by_tenant(events)  # every event, per-tenant publish order
    assert second.by_tenant == expected_by_tenant(events)
    assert first.calls == second.calls == len(events)


def test_graceful_restart_resumes_from_snapshot_without_reapplying(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), snapshot_every_events=1000)
    state_dir = tmp_path / "state"
    before, after = completed_events(10), completed_events(5)
    first, second = RecordingApplier(), RecordingApplier()

    async def consume(applier: RecordingApplier, events: list) -> KafkaConsumerRunner:  # type: ignore[type-arg]
        publisher = KafkaPublisher(settings, tmp_path / "outbox.sqlite3")
        await publisher.start()
        for event in events:
            publisher.publish(event)
        await publisher.flushed(timeout_s=DRAIN_S)
        await publisher.stop()
        runner = KafkaConsumerRunner(
            broker.bootstrap, settings.topic, "g", applier, state_dir, settings=settings
        )
        await runner.start()
        bus = KafkaBus(settings, tmp_path)
        bus.runners["g"] = runner  # reuse drain(): wait until the runner covers the whole log
        await bus.drain(timeout_s=DRAIN_S)
        await runner.stop()
        return runner

    async def scenario() -> None:
        await consume(first, before)
        runner = await consume(second, after)  # a new process: restored from the saved state
        assert runner.counters.applied == len(after)
        assert runner.counters.duplicates == 0

    run(scenario())
    assert second.by_tenant == expected_by_tenant(before + after)
    assert second.calls == len(after)  # nothing before the stop was fed again
