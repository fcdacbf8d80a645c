"""Dead-letter topic: records a consumer gave up on, with headers saying why, sent acknowledged.

A dead letter keeps the original record's key, value and headers (its ``ce_type``, its trace context),
followed by the ``dlt.*`` headers: replaying it (value + the original headers) reads as the original did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaProducer, ConsumerRecord

from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import error_text

log = logging.getLogger(__name__)

DLT_HEADER_PREFIX = "dlt."  # the headers a dead letter adds to the original record's
REASON_DECODE = "decode"  # the record is not a usable event of its stream (or of a type it does not carry)
REASON_APPLY = "apply"  # the applier raised on every attempt


def dlt_headers(
    record: ConsumerRecord, group: str, reason: str, exc: BaseException, attempts: int
) -> list[tuple[str, bytes]]:
    """The original record's headers (minus earlier ``dlt.*`` ones), then where it came from and why it was
    given up on."""
    original = [(name, bytes(value or b"")) for name, value in record.headers or ()
                if not name.startswith(DLT_HEADER_PREFIX)]  # fmt: skip
    return [
        *original,
        (DLT_HEADER_PREFIX + "reason", reason.encode()),
        (DLT_HEADER_PREFIX + "error", error_text(exc).encode()),
        (DLT_HEADER_PREFIX + "attempts", str(attempts).encode()),
        (DLT_HEADER_PREFIX + "group", group.encode()),
        (DLT_HEADER_PREFIX + "topic", record.topic.encode()),
        (DLT_HEADER_PREFIX + "partition", str(record.partition).encode()),
        (DLT_HEADER_PREFIX + "offset", str(record.offset).encode()),
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
                max_request_size=self.settings.max_record_bytes,  # a dead letter is as large as its record
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
