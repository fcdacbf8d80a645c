"""One Kafka record into one applier: decode, apply with retries, dead-letter what cannot be.

Each record is handled inside a CONSUMER span whose parent is the trace context its headers carry
(``events.trace_context``): the apply joins the trace of the request that published the event.
"""

from __future__ import annotations

from typing import Any

from aiokafka import ConsumerRecord
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from lookahead_rag.services.events.kafka.dead_letter import REASON_APPLY, REASON_DECODE, DeadLetterSender
from lookahead_rag.services.events.protocols import ConsumerCounters, EventApplier, apply_with_retries, error_text
from lookahead_rag.services.events.records import decode_record
from lookahead_rag.services.events.streams import GENERATIONS, Stream
from lookahead_rag.services.events.trace_context import consumer_span

EVENT_ID_ATTRIBUTE = "messaging.message.id"  # span attribute: the event id (OpenTelemetry messaging conventions)
OUTCOME_ATTRIBUTE = "lookahead.event.outcome"  # span attribute: applied | duplicate | dead-lettered
APPLIED, DUPLICATE, DEAD_LETTERED = "applied", "duplicate", "dead-lettered"


def decode_event(record: ConsumerRecord, stream: Stream = GENERATIONS) -> Any:
    """A record of ``stream`` into its event, by its ``ce_type`` header (or, an old record without one,
    its value); raises on a record that is not a usable event of that stream."""
    return decode_record(stream, record.value, record.headers)


class RecordHandler:
    """Applies records to ``applier``; a record it gives up on goes to the DLT before it returns."""

    def __init__(
        self,
        applier: EventApplier,
        dead_letters: DeadLetterSender,
        counters: ConsumerCounters,
        max_attempts: int,
        retry_backoff_s: float,
        stream: Stream = GENERATIONS,
        tracer: Tracer | None = None,
    ) -> None:
        """``stream``: what the records carry; ``tracer``: the consumer spans' (default: the global
        provider's, a no-op when none is installed)."""
        self.applier = applier
        self.stream = stream
        self.dead_letters = dead_letters
        self.counters = counters
        self.max_attempts = max_attempts
        self.retry_backoff_s = retry_backoff_s
        self.tracer = tracer

    async def handle(self, record: ConsumerRecord) -> None:
        """Done with the record when this returns; raises only when the DLT could not take it."""
        with consumer_span(
            record.headers, topic=record.topic, group=self.dead_letters.group, partition=record.partition,
            offset=record.offset, tracer=self.tracer,
        ) as span:  # fmt: skip
            await self._handle(record, span)

    async def _handle(self, record: ConsumerRecord, span: Span) -> None:
        try:
            event = decode_event(record, self.stream)
        except Exception as exc:  # undecodable (or a type this stream does not carry): retrying cannot help
            _failed(span, exc)
            await self.dead_letters.send(record, REASON_DECODE, exc, attempts=1)
            self.counters.dead_lettered += 1
            return
        span.set_attribute(EVENT_ID_ATTRIBUTE, event.event_id)
        outcome = await apply_with_retries(self.applier, event, self.max_attempts, self.retry_backoff_s)
        if outcome.error is not None:
            _failed(span, outcome.error)
            self.counters.apply_errors += outcome.attempts
            await self.dead_letters.send(record, REASON_APPLY, outcome.error, outcome.attempts)
            self.counters.dead_lettered += 1
        elif outcome.applied:
            span.set_attribute(OUTCOME_ATTRIBUTE, APPLIED)
            self.counters.applied += 1
            self.counters.apply_errors += outcome.attempts - 1
        else:
            span.set_attribute(OUTCOME_ATTRIBUTE, DUPLICATE)
            self.counters.duplicates += 1


def _failed(span: Span, exc: BaseException) -> None:
    """Mark the consumer span: the record was given up on (dead-lettered)."""
    span.set_attribute(OUTCOME_ATTRIBUTE, DEAD_LETTERED)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, error_text(exc)))
