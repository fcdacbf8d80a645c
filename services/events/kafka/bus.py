"""``KafkaBus``: the ``EventBus`` over Kafka, a ``KafkaPublisher`` plus one ``KafkaConsumerRunner`` per group.

``KafkaBus`` has the in-process bus's interface (publish, subscribe(group, applier), start, stop,
drain, counters, stats), so services do not care which one ``make_bus`` gave them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from lookahead_rag.v1 import events_pb2

from services.events.kafka.cluster_offsets import log_end_offsets
from services.events.kafka.consumer import KafkaConsumerRunner
from services.events.kafka.publisher import KafkaPublisher
from services.events.kafka.settings import KafkaSettings
from services.events.protocols import BusStats, ConsumerCounters, EventApplier

log = logging.getLogger(__name__)


class KafkaBus:
    """Publisher plus one ``KafkaConsumerRunner`` per subscribed group; same interface as ``InProcessBus``."""

    def __init__(self, settings: KafkaSettings, data_dir: Path) -> None:
        self.settings = settings
        self.data_dir = Path(data_dir)
        self.runners: dict[str, KafkaConsumerRunner] = {}
        self._publisher: KafkaPublisher | None = None
        self._started = False

    @property
    def publisher(self) -> KafkaPublisher:
        if self._publisher is None:
            self._publisher = KafkaPublisher(self.settings, self.settings.resolved_outbox_path(self.data_dir))
        return self._publisher

    def publish(self, event: events_pb2.GenerationCompleted) -> None:
        self.publisher.publish(event)

    def subscribe(self, group: str, applier: EventApplier) -> None:
        """Consume every event as Kafka group ``settings.group_id(group)``; call before start()."""
        if self._started:
            raise RuntimeError("KafkaBus.subscribe() after start()")
        if group in self.runners:
            raise ValueError(f"group {group!r} already has an applier")
        s = self.settings
        state_dir = s.resolved_state_dir(self.data_dir)
        self.runners[group] = KafkaConsumerRunner(
            s.bootstrap_servers, s.topic, s.group_id(group), applier, state_dir, settings=s
        )

    def counters(self, group: str) -> ConsumerCounters:
        return self.runners[group].counters

    def stats(self) -> BusStats:
        """Each group's counters (copies) and the outbox's depth and acknowledged total (the outbox:
        None while no publisher is open, i.e. before the first publish/start or after stop; a metrics
        read never opens one)."""
        consumers = {group: dataclasses.replace(runner.counters) for group, runner in self.runners.items()}
        publisher = self._publisher
        return BusStats(consumers, None if publisher is None else publisher.stats())

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await self.publisher.start()
        for runner in self.runners.values():
            await runner.start()

    async def stop(self) -> None:
        """Flush the outbox (bounded), then stop each consumer gracefully (commit + snapshot)."""
        if not self._started:
            return
        await self.publisher.stop()
        self._publisher = None
        for runner in self.runners.values():
            await runner.stop()
        self._started = False

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait until the outbox is empty and every group has applied everything in the topic."""

        async def _drain() -> None:
            await self.publisher.flushed()
            cluster, ends = await log_end_offsets(self.settings)
            for runner in self.runners.values():
                await runner.wait_caught_up(cluster, ends)

        await asyncio.wait_for(_drain(), timeout_s)
