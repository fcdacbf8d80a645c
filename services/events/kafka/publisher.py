"""``KafkaPublisher``: publish appends to the durable SQLite outbox; a flusher sends it to Kafka.

Each row is the event's record (``events.records``): its bare protobuf, its type in CloudEvents headers,
and the publishing span's trace context (``events.trace_context``), stored with it so a send after a
restart still carries the request's context. Rows an older version left in the outbox (values in the
pre-header format, no headers) are re-encoded in today's format when sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from lookahead_rag.services.events.kafka.broker import ensure_topics
from lookahead_rag.services.events.kafka.outbox import FlusherConfig, Outbox, OutboxFlusher, OutboxRow
from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import FRAMED_FORMAT, KafkaSettings
from lookahead_rag.services.events.kafka.topics import stream_configs
from lookahead_rag.services.events.protocols import OutboxStats
from lookahead_rag.services.events.records import encode_record, upgrade_legacy
from lookahead_rag.services.events.streams import GENERATIONS, Event, Stream
from lookahead_rag.services.events.trace_context import context_headers


class KafkaPublisher:
    """``publish`` appends to the SQLite outbox (about a millisecond); a flusher sends it to Kafka."""

    def __init__(
        self,
        settings: KafkaSettings,
        outbox_path: Path,
        key: Callable[[Any], bytes] | None = None,
        stream: Stream = GENERATIONS,
    ) -> None:
        """Sends ``stream``'s events to ``settings.topic``; ``key``: the record key of an event (default:
        the stream's)."""
        self.settings = settings
        self.stream = stream
        self._key = key or stream.key
        self._framed = settings.record_format == FRAMED_FORMAT
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
        self.flusher = OutboxFlusher(self.outbox, settings.topic, self._producer, config, on_connect, self._upgrade)

    def publish(self, event: Event) -> None:
        """Durably queue the event's record (with the caller's trace context) under its key; never waits on
        the broker."""
        record = encode_record(event, framed=self._framed, context=context_headers())
        self.outbox.append(record.value, self._key(event), record.headers)
        self.flusher.wake()

    def _upgrade(self, row: OutboxRow) -> OutboxRow:
        """A row an older version stored (pre-header value, no headers) in today's record format."""
        record = upgrade_legacy(self.stream, row.value, framed=self._framed)
        return dataclasses.replace(row, value=record.value, headers=record.headers)

    def depth(self) -> int:
        """Events not yet acknowledged by the broker (a metric)."""
        return self.outbox.depth()

    def stats(self) -> OutboxStats:
        """The outbox's depth, the events the broker acknowledged and those set aside so far (metrics)."""
        counters = self.flusher.counters
        return OutboxStats(depth=self.outbox.depth(), sent=counters.sent, set_aside=counters.set_aside)

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
            max_request_size=s.max_record_bytes,  # the largest event a service emits (settings)
            **client_security(s),
        )

    async def _ensure_topics(self) -> None:
        s = self.settings
        topics = {s.topic: s.partitions, s.dlt_topic: s.dlt_partitions}
        await ensure_topics(s.bootstrap_servers, topics, s.replication_factor, s.request_timeout_ms,
                            security=client_security(s), configs=stream_configs(s, self.stream))
