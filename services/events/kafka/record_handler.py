"""One Kafka record into one applier: decode, apply with retries, dead-letter what cannot be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiokafka import ConsumerRecord

from lookahead_rag.services.events.kafka.dead_letter import REASON_APPLY, REASON_DECODE, DeadLetterSender
from lookahead_rag.services.events.protocols import ConsumerCounters, EventApplier, apply_with_retries
from lookahead_rag.services.events.streams import GENERATIONS


def decode_event(value: bytes | None) -> Any:
    """Parse a record value of the GENERATIONS stream (a GenerationCompleted or a ForgetRequested);
    raises on bytes that are not a usable event."""
    return GENERATIONS.decode(value)


class RecordHandler:
    """Applies records to ``applier``; a record it gives up on goes to the DLT before it returns."""

    def __init__(
        self,
        applier: EventApplier,
        dead_letters: DeadLetterSender,
        counters: ConsumerCounters,
        max_attempts: int,
        retry_backoff_s: float,
        decode: Callable[[bytes | None], Any] = decode_event,
    ) -> None:
        """``decode``: a record value into an event (raises on a value that is not one)."""
        self.applier = applier
        self.decode = decode
        self.dead_letters = dead_letters
        self.counters = counters
        self.max_attempts = max_attempts
        self.retry_backoff_s = retry_backoff_s

    async def handle(self, record: ConsumerRecord) -> None:
        """Done with the record when this returns; raises only when the DLT could not take it."""
        try:
            event = self.decode(record.value)
        except Exception as exc:  # undecodable: retrying cannot help
            await self.dead_letters.send(record, REASON_DECODE, exc, attempts=1)
            self.counters.dead_lettered += 1
            return
        outcome = await apply_with_retries(self.applier, event, self.max_attempts, self.retry_backoff_s)
        if outcome.error is not None:
            self.counters.apply_errors += outcome.attempts
            await self.dead_letters.send(record, REASON_APPLY, outcome.error, outcome.attempts)
            self.counters.dead_lettered += 1
        elif outcome.applied:
            self.counters.applied += 1
            self.counters.apply_errors += outcome.attempts - 1
        else:
            self.counters.duplicates += 1
