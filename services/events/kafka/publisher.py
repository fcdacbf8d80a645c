"""``KafkaPublisher``: publish appends to the durable SQLite outbox; a flusher sends it to Kafka."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from lookahead_rag.services.events.kafka.broker import ensure_topics
from lookahead_rag.services.events.kafka.outbox import FlusherConfig, Outbox, OutboxFlusher
from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import OutboxStats
from lookahead_rag.services.events.streams import Event, encode_event, tenant_key


class KafkaPublisher:
    """``publish`` appends to the SQLite outbox (about a millisecond); a flusher sends it to Kafka."""

    def __init__(self, settings: KafkaSettings, outbox_path: Path, key: Callable[[Any], bytes] = tenant_key) -> None:
        """Sends to ``settings.topic``; ``key``: the record key of an event (the stream's)."""
        self.settings = settings
        self._key = key
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

    def publish(self, event: Event) -> None:
        """Durably queue the event under its key (the tenant by default); never waits on the broker."""
        self.outbox.append(encode_event(event), self._key(event))  # framed when not its stream's first type
        self.flusher.wake()

    def depth(self) -> int:
        """Events not yet acknowledged by the broker (a metric)."""
        return self.outbox.depth()

    def stats(self) -> OutboxStats:
        """The outbox's depth and the events the broker acknowledged so far (metrics)."""
        return OutboxStats(depth=self.outbox.depth(), sent=self.flusher.counters.sent)

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
            **client_security(s),
        )

    async def _ensure_topics(self) -> None:
        s = self.settings
        topics = {s.topic: s.partitions, s.dlt_topic: s.dlt_partitions}
        await ensure_topics(s.bootstrap_servers, topics, s.replication_factor, s.request_timeout_ms,
                            security=client_security(s))
