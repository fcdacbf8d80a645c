"""Dead-letter topic: records a consumer gave up on, with headers saying why, sent acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaProducer, ConsumerRecord

from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import error_text

log = logging.getLogger(__name__)

REASON_DECODE = "decode"  # the value is not a usable GenerationCompleted
REASON_APPLY = "apply"  # the applier raised on every attempt


def dlt_headers(
    record: ConsumerRecord, group: str, reason: str, exc: BaseException, attempts: int
) -> list[tuple[str, bytes]]:
    """Where the record came from and why it was given up on."""
    return [
        ("dlt.reason", reason.encode()),
        ("dlt.error", error_text(exc).encode()),
        ("dlt.attempts", str(attempts).encode()),
        ("dlt.group", group.encode()),
        ("dlt.topic", record.topic.encode()),
        ("dlt.partition", str(record.partition).encode()),
        ("dlt.offset", str(record.offset).encode()),
    ]


class DeadLetterSender:
    """Sends records to ``settings.dlt_topic``; the producer starts on the first dead letter."""

    def __init__(self, settings: KafkaSettings, group: str) -> None:
        self.settings = settings
        self.group = group
        self._producer: AIOKafkaProducer | None = None

    async def send(self, record: ConsumerRecord, reason: str, exc: BaseException, attempts: int) -> None:
        """Returns once the broker acknowledged it; raises when it could not (the caller retries)."""
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.settings.bootstrap_servers,
                acks=self.settings.producer_acks(),
                client_id=f"{self.settings.client_id}.{self.group}.dlt",
                **client_security(self.settings),
            )
            await producer.start()
            self._producer = producer
        headers = dlt_headers(record, self.group, reason, exc, attempts)
        await self._producer.send_and_wait(self.settings.dlt_topic, record.value, key=record.key, headers=headers)
        log.error("%s: %s:%d@%d dead-lettered (%s): %r", self.group, record.topic, record.partition,
                  record.offset, reason, exc)  # fmt: skip

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), self.settings.shutdown_timeout_s)
