"""The event bus over Kafka: ``KafkaPublisher`` (outbox + flusher) and ``KafkaBus`` (publisher + runners).

``KafkaBus`` has the in-process bus's interface (publish, subscribe(group, applier), start, stop,
drain), so services do not care which one ``make_bus`` gave them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiokafka import AIOKafkaProducer
from lookahead_rag.v1 import events_pb2

from services.common.broker import ensure_topics
from services.common.bus import ConsumerCounters, EventApplier
from services.common.kafka_consumer import KafkaConsumerRunner
from services.common.kafka_log import log_end_offsets
from services.common.kafka_settings import KafkaSettings
from services.common.outbox import FlusherConfig, Outbox, OutboxFlusher

__all__ = ["KafkaBus", "KafkaConsumerRunner", "KafkaPublisher"]

log = logging.getLogger(__name__)



class KafkaPublisher:
    """``publish`` appends to the SQLite outbox (about a millisecond); a flusher sends it to Kafka."""

    def __init__(self, settings: KafkaSettings, outbox_path: Path) -> None:
        self.settings = settings
        self.outbox = Outbox(outbox_path, settings.outbox_synchronous)
        config = FlusherConfig(
            batch_size=settings.outbox_batch_size,
            poll_interval_s=settings.outbox_poll_interval_s,
            send_timeout_s=settings.send_timeout_s,
            backoff_s=settings.reconnect_backoff_s,
            backoff_max_s=settings.reconnect_backoff_max_s,
            stop_timeout_s=settings.shutdown_timeout_s,
        )
        on_connect = self._ensure_topics if settings.create_topics else None
        self.flusher = OutboxFlusher(self.outbox, settings.topic, self._producer, config, on_connect)

    def publish(self, event: events_pb2.GenerationCompleted) -> None:
        """Durably queue the event, keyed by tenant; never waits on the broker."""
        self.outbox.append(event.SerializeToString(), event.tenant.encode())
        self.flusher.wake()

    def depth(self) -> int:
        """Events not yet acknowledged by the broker (a metric)."""
        return self.outbox.depth()

    async def start(self) -> None:
        await self.flusher.start()  # also resends what a previous run left unacknowledged

    async def stop(self) -> None:
        await self.flusher.stop()
        self.outbox.close()

    async def flushed(self, timeout_s: float | None = None) -> None:
        await self.flusher.flushed(timeout_s)

    def _producer(self) -> AIOKafkaProducer:
        s = self.settings
        return AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}.publisher",
            acks=s.producer_acks(),
            enable_idempotence=s.enable_idempotence,
            linger_ms=s.linger_ms,
            request_timeout_ms=s.request_timeout_ms,
        )

    async def _ensure_topics(self) -> None:
        s = self.settings
        topics = {s.topic: s.partitions, s.dlt_topic: s.dlt_partitions}
        await ensure_topics(s.bootstrap_servers, topics, s.replication_factor, s.request_timeout_ms)


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

    def outbox_depth(self) -> int:
        return self.publisher.depth()

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
