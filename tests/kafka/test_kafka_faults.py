"""The Kafka feedback loop under faults: consumer killed, broker stopped, poison messages, rebalances."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from lookahead_rag.services.events import DRAFTCACHE_GROUP, RETRIEVER_GROUP
from lookahead_rag.services.events.kafka.broker import LocalBroker, ensure_topics
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.cluster_offsets import cluster_view, log_end_offsets
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.state import read_state, state_path
from lookahead_rag.v1 import events_pb2
from tests.builders import completed_events
from tests.kafka.helpers import (
    CrashAfter,
    RecordingApplier,
    deliver,
    expected_by_tenant,
    fast_settings,
    new_topic,
    read_topic,
    require_tansu,
    run,
    started,
    wait_until,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
WAIT_S = 30.0


async def publish_all(
    settings: KafkaSettings, outbox: Path, events: list[events_pb2.GenerationCompleted]
) -> None:
    publisher = KafkaPublisher(settings, outbox)
    await publisher.start()
    for event in events:
        publisher.publish(event)
    await publisher.flushed(timeout_s=WAIT_S)
    await publisher.stop()


async def caught_up(runner: KafkaConsumerRunner, settings: KafkaSettings) -> None:
    cluster, ends = await log_end_offsets(settings)
    await runner.wait_caught_up(cluster, ends, timeout_s=WAIT_S)


async def committed_offsets(settings: KafkaSettings, group: str) -> dict[int, int]:
    """The group's committed offsets (aiokafka's admin call does not parse tansu's answer)."""
    bootstrap = settings.bootstrap_servers
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        _, partitions = await cluster_view(settings.bootstrap_servers, settings.topic, WAIT_S)
        tps = [TopicPartition(settings.topic, p) for p in partitions]
        committed = {tp.partition: await asyncio.wait_for(consumer.committed(tp), WAIT_S) for tp in tps}
    finally:
        await consumer.stop()
    return {p: off for p, off in committed.items() if off is not None}


def runner_for(
    settings: KafkaSettings, group: str, applier: RecordingApplier, state_dir: Path
) -> KafkaConsumerRunner:
    bootstrap, topic = settings.bootstrap_servers, settings.topic
    return KafkaConsumerRunner(bootstrap, topic, group, applier, state_dir, settings=settings)


def test_consumer_killed_between_apply_and_commit_ends_in_the_same_state(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    # One partition, batches of 2 (a commit after each), a snapshot every 5 events, killed right
    # after the 8th apply: the commit (6) is ahead of the snapshot (5), and 7..8 were applied but
    # neither committed nor saved.
    settings = fast_settings(
        broker.bootstrap, new_topic(), partitions=1, max_poll_records=2, snapshot_every_events=5
    )
    events = completed_events(20)
    crashing, resumed, reference = CrashAfter(limit=8), RecordingApplier(), RecordingApplier()

    async def scenario() -> None:
        await publish_all(settings, tmp_path / "outbox.sqlite3", events)
        killed = runner_for(settings, "g", crashing, tmp_path / "state")
        await killed.start()
        await wait_until(lambda: crashing.calls >= crashing.limit)
        await asyncio.wait_for(killed.kill(), WAIT_S)  # dies after its 8th apply: no commit, no snapshot
        saved = read_state(state_path(tmp_path / "state", "g"))
        assert saved is not None and saved.offsets == {0: 5}  # the snapshot taken at 5
        assert await committed_offsets(settings, "g") == {0: 6}  # the commit after the 3rd batch

        restarted = runner_for(settings, "g", resumed, tmp_path / "state")  # a fresh process
        await restarted.start()
        await caught_up(restarted, settings)
        await asyncio.wait_for(restarted.stop(), WAIT_S)
        assert restarted.counters.duplicates == 0  # nothing in the restored snapshot was fed again
        assert restarted.counters.applied == len(events) - 5  # 6..8 were applied again: redelivery

        clean = runner_for(settings, "other", reference, tmp_path / "state")  # a run without the kill
        await clean.start()
        await caught_up(clean, settings)
        await asyncio.wait_for(clean.stop(), WAIT_S)

    run(scenario())
    assert crashing.calls + resumed.calls > len(events)  # some events really came twice
    assert resumed.snapshot() == reference.snapshot()
    assert resumed.by_tenant == expected_by_tenant(events)


def test_broker_stopped_while_publishing_loses_nothing_and_applies_once(tmp_path: Path) -> None:
    local = LocalBroker(binary=require_tansu(), log_path=tmp_path / "tansu.log")
    local.start()
    settings = fast_settings(local.bootstrap, new_topic())
    before, during = completed_events(10), completed_events(10)
    draft, sessions = RecordingApplier(), RecordingApplier()

    async def scenario() -> None:
        bus = await started(KafkaBus(settings, tmp_path), {DRAFTCACHE_GROUP: draft, RETRIEVER_GROUP: sessions})
        try:
            await deliver(bus, before, WAIT_S)
            local.stop()
            for event in during:
                bus.publish(event)  # answers keep coming: publish must not fail or wait
            outbox = bus.stats().outbox
            assert outbox is not None and outbox.depth == len(during)
            local.start()  # same port, empty (memory storage), new cluster id
            await bus.drain(timeout_s=WAIT_S)
        finally:
            await bus.stop()
            local.stop()

    run(scenario())
    expected = expected_by_tenant(before + during)
    assert draft.by_tenant == expected  # every event once, in order
    assert sessions.by_tenant == expected


def test_poison_messages_go_to_the_dlt_and_later_events_are_applied(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), partitions=1, dlt_max_attempts=3)
    unappliable, good = completed_events(1), completed_events(6)
    applier = RecordingApplier(fail_ids=frozenset({unappliable[0].event_id}))

    async def scenario() -> None:
        await ensure_topics(broker.bootstrap, {settings.topic: 1, settings.dlt_topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(settings.topic, b"not a protobuf", key=b"acme")
            await producer.send_and_wait(settings.topic, unappliable[0].SerializeToString(), key=b"acme")
        finally:
            await producer.stop()
        await publish_all(settings, tmp_path / "outbox.sqlite3", good)
        runner = runner_for(settings, "g", applier, tmp_path / "state")
        await runner.start()
        await caught_up(runner, settings)
        await runner.stop()
        assert runner.counters.dead_lettered == 2
        assert runner.counters.applied == len(good)

        dead = await read_topic(broker.bootstrap, settings.dlt_topic, 2)
        headers = [dict(r.headers) for r in dead]
        assert [h["dlt.reason"] for h in headers] == [b"decode", b"apply"]
        assert [h["dlt.attempts"] for h in headers] == [b"1", b"3"]
        assert [h["dlt.offset"] for h in headers] == [b"0", b"1"]
        assert dead[0].value == b"not a protobuf" and dead[1].key == b"acme"

    run(scenario())
    assert applier.by_tenant == expected_by_tenant(good)
    assert applier.calls == len(good) + 3  # three attempts for the unappliable event


def test_rebalance_commits_and_saves_what_was_applied_before_revoke(
    broker: LocalBroker,
    tmp_path: Path,
) -> None:
    # Commits only on revoke (huge interval) and no periodic snapshot: the revoke must do both.
    settings = fast_settings(
        broker.bootstrap, new_topic(), commit_interval_s=3600.0, snapshot_every_events=10_000,
        snapshot_interval_s=3600.0,
    )  # fmt: skip
    events = completed_events(12)
    first, second = RecordingApplier(), RecordingApplier()

    async def scenario() -> None:
        await publish_all(settings, tmp_path / "outbox.sqlite3", events)
        a = runner_for(settings, "shared", first, tmp_path / "a")
        await a.start()
        await caught_up(a, settings)
        assert a.commits == 0 and read_state(a.state_path) is None
        b = runner_for(settings, "shared", second, tmp_path / "b")
        await b.start()
        await b.wait_assigned(timeout_s=WAIT_S)  # a gave partitions up (revoke) for b to take some
        await a.wait_assigned(timeout_s=WAIT_S)
        saved = read_state(a.state_path)
        committed = await committed_offsets(settings, "shared")
        await asyncio.gather(a.kill(), b.kill())
        assert saved is not None and sum(saved.offsets.values()) == len(events)
        assert sum(committed.values()) == len(events)

    run(scenario())
    assert first.by_tenant == expected_by_tenant(events)
    assert second.questions() <= first.questions()  # b (no saved state) rebuilt its partitions from the log


def test_a_failed_assignment_callback_seeks_again_before_applying(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The group has committed the end of the log, but this member's state is empty: it must read
    # from the start even when its first seek (in the rebalance callback) fails.
    settings = fast_settings(broker.bootstrap, new_topic())
    events = completed_events(9)
    first, second = RecordingApplier(), RecordingApplier()
    real_seek = KafkaConsumerRunner._seek_assigned
    failures = []

    async def failing_once(self: KafkaConsumerRunner, consumer: object, assigned: object) -> None:
        if not failures:
            failures.append(True)
            raise RuntimeError("metadata unavailable")
        await real_seek(self, consumer, assigned)  # type: ignore[arg-type]

    async def scenario() -> None:
        await publish_all(settings, tmp_path / "outbox.sqlite3", events)
        committed_all = runner_for(settings, "g", first, tmp_path / "a")
        await committed_all.start()
        await caught_up(committed_all, settings)
        await asyncio.wait_for(committed_all.stop(), WAIT_S)
        assert sum((await committed_offsets(settings, "g")).values()) == len(events)

        monkeypatch.setattr(KafkaConsumerRunner, "_seek_assigned", failing_once)
        fresh = runner_for(settings, "g", second, tmp_path / "b")
        await fresh.start()
        await caught_up(fresh, settings)
        await asyncio.wait_for(fresh.stop(), WAIT_S)
        assert failures == [True]

    run(scenario())
    assert second.by_tenant == expected_by_tenant(events)
