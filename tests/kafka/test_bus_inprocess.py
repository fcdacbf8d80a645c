"""The in-process bus of the embedded default: fan-out, order, idempotence, retries, dead letters."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from lookahead_rag.services.events import DRAFTCACHE_GROUP, RETRIEVER_GROUP, EventApplier, EventBus
from lookahead_rag.services.events.factory import make_bus
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.v1 import events_pb2
from tests.builders import completed_events
from tests.kafka.helpers import RecordingApplier, deliver, expected_by_tenant, run, started

pytestmark = pytest.mark.timeout(30)


class FlakyApplier(RecordingApplier):
    """Fails the first ``failures`` attempts of every event, then applies it."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts: dict[str, int] = {}

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        seen = self.attempts.get(event.event_id, 0)
        self.attempts[event.event_id] = seen + 1
        if seen < self.failures:
            raise RuntimeError("transient")
        return super().apply(event)


def test_make_bus_without_bootstrap_is_in_process(tmp_path: Path) -> None:
    bus = make_bus(KafkaSettings(bootstrap_servers=""), tmp_path)
    assert isinstance(bus, InProcessBus)
    assert isinstance(RecordingApplier(), EventApplier)


def test_every_event_reaches_both_appliers_in_order(tmp_path: Path) -> None:
    events = completed_events(12)
    draft, sessions = RecordingApplier(), RecordingApplier()

    async def scenario() -> None:
        bus: EventBus = make_bus(KafkaSettings(bootstrap_servers=""), tmp_path)
        await started(bus, {DRAFTCACHE_GROUP: draft, RETRIEVER_GROUP: sessions})
        await deliver(bus, events, timeout_s=5)
        await bus.stop()
        assert bus.counters(DRAFTCACHE_GROUP).applied == len(events)

    run(scenario())
    assert draft.by_tenant == expected_by_tenant(events)
    assert sessions.by_tenant == expected_by_tenant(events)


def test_redelivered_event_leaves_state_unchanged() -> None:
    applier = RecordingApplier()
    (event,) = completed_events(1, ("acme",))

    async def scenario() -> None:
        bus = await started(InProcessBus(), {"g": applier})
        await deliver(bus, [event], timeout_s=5)
        before = applier.snapshot()
        await deliver(bus, [event], timeout_s=5)
        assert applier.snapshot() == before
        assert bus.counters("g").duplicates == 1
        await bus.stop()

    run(scenario())


def test_failing_applier_is_retried_then_dead_lettered_and_bus_moves_on() -> None:
    events = completed_events(4)
    poison = events[1].event_id
    broken = RecordingApplier(fail_ids=frozenset({poison}))
    flaky = FlakyApplier(failures=2)

    async def scenario() -> InProcessBus:
        bus = await started(InProcessBus(max_attempts=3), {"broken": broken, "flaky": flaky})
        await deliver(bus, events, timeout_s=5)
        await bus.stop()
        return bus

    bus = asyncio.run(scenario())
    assert [d.event_id for d in bus.dead_letters] == [poison]
    assert bus.dead_letters[0].group == "broken" and bus.dead_letters[0].attempts == 3
    assert broken.questions() == {e.question for e in events if e.event_id != poison}
    assert flaky.questions() == {e.question for e in events}  # two failures < three attempts
    assert bus.counters("broken").dead_lettered == 1
    assert bus.counters("flaky").apply_errors == 2 * len(events)


def test_publish_from_another_thread_and_before_start() -> None:
    applier = RecordingApplier()
    early, late = completed_events(2, ("acme",))

    async def scenario() -> None:
        bus = InProcessBus()
        bus.subscribe("g", applier)
        bus.publish(early)  # queued until start()
        await bus.start()
        thread = threading.Thread(target=bus.publish, args=(late,))
        thread.start()
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # let the thread-safe callback run
        await bus.drain(timeout_s=5)
        await bus.stop()

    run(scenario())
    assert applier.by_tenant == {"acme": ["acme-q0", "acme-q1"]}


def test_stop_applies_what_is_queued_and_subscribe_twice_is_refused() -> None:
    applier = RecordingApplier()
    events = completed_events(5)

    async def scenario() -> None:
        bus = InProcessBus()
        bus.subscribe("g", applier)
        with pytest.raises(ValueError, match="already"):
            bus.subscribe("g", RecordingApplier())
        await bus.start()
        for event in events:
            bus.publish(event)
        await bus.stop()

    run(scenario())
    assert applier.by_tenant == expected_by_tenant(events)
