"""W3C trace context across Kafka: injected at publish, kept in the outbox, a CONSUMER span on the other side.

The tests build their own SDK ``TracerProvider`` with an in-memory exporter and hand its tracer to what
they test: the global provider (set once per process, maybe by another module's tests) is left alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.outbox import Outbox
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.record_handler import RecordHandler
from lookahead_rag.services.events.protocols import ConsumerCounters
from lookahead_rag.services.events.records import encode_record, header
from lookahead_rag.services.events.trace_context import consumer_span, context_headers
from tests.builders import completed
from tests.kafka.helpers import RecordingApplier, fast_settings, new_topic, read_topic, wait_until

pytestmark = pytest.mark.timeout(120)

TOPIC = "lookahead.generation-completed"  # the topic name the unit tests' records claim
UNREACHABLE = "127.0.0.1:1"  # a bootstrap nothing listens on: the publisher is never started there


class TraceRecorder(RecordingApplier):
    """Records the trace id current inside each apply (the applier runs in a worker thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.trace_ids: list[int] = []

    def apply(self, event: Any) -> bool:
        self.trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        return super().apply(event)


class NoDeadLetters:
    group = "g"

    async def send(self, record: Any, reason: str, exc: BaseException, attempts: int) -> None:
        raise AssertionError(f"unexpected dead letter ({reason}): {exc!r}")


@pytest.fixture
def spans() -> Iterator[tuple[Tracer, InMemorySpanExporter]]:
    """A tracer of a private SDK provider and the exporter holding its finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def consumer_record(value: bytes, headers: tuple[tuple[str, bytes], ...]) -> Any:
    return ConsumerRecord(TOPIC, 2, 41, 0, 0, b"acme", value, None, 0, len(value), headers)


def handle(tracer: Tracer, applier: RecordingApplier, record: Any) -> None:
    handler = RecordHandler(applier, NoDeadLetters(), ConsumerCounters(), 1, 0.0, tracer=tracer)  # type: ignore[arg-type]
    asyncio.run(handler.handle(record))


def consumer_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]


def test_publishing_inside_a_span_injects_its_traceparent(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, _ = spans
    with tracer.start_as_current_span("request") as request:
        headers = context_headers()
    ctx = request.get_span_context()
    # traceparent = version-traceid-spanid-flags of the active span
    assert header(headers, "traceparent") == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()


def test_outside_a_span_nothing_is_injected() -> None:
    # no active span (and, for the default tracer, maybe no provider): no headers, nothing to pay
    assert context_headers() == ()


def test_the_consumer_span_joins_the_producers_trace(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    event, applier = completed(), TraceRecorder()
    with tracer.start_as_current_span("request") as request:
        record = encode_record(event, context=context_headers())
    handle(tracer, applier, consumer_record(record.value, record.headers))
    producer = request.get_span_context()
    [span] = consumer_spans(exporter)
    # the consumer span is a child of the request's span, in its trace
    assert span.context.trace_id == producer.trace_id
    assert span.parent is not None and span.parent.span_id == producer.span_id
    assert span.name == f"process {TOPIC}"
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == event.event_id
    assert span.attributes["messaging.kafka.offset"] == 41
    # the applier's work ran inside that span (its own spans would join the trace too)
    assert applier.trace_ids == [producer.trace_id]


def test_the_context_survives_a_round_trip_through_the_outbox(
    spans: tuple[Tracer, InMemorySpanExporter], tmp_path: Path
) -> None:
    tracer, exporter = spans
    path, event = tmp_path / "outbox.sqlite3", completed()
    publisher = KafkaPublisher(fast_settings(UNREACHABLE, new_topic()), path)
    with tracer.start_as_current_span("request") as request:
        publisher.publish(event)  # stored; never sent by this process
    publisher.outbox.close()
    reopened = Outbox(path)  # a later process finds the row with the request's context
    [row] = reopened.pending(10)
    reopened.close()
    assert row.headers is not None
    handle(tracer, RecordingApplier(), consumer_record(row.value, row.headers))
    [span] = consumer_spans(exporter)
    assert span.context.trace_id == request.get_span_context().trace_id


def test_a_record_without_context_starts_a_new_trace(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    record = encode_record(completed())  # published outside any span (or by an older version)
    handle(tracer, RecordingApplier(), consumer_record(record.value, record.headers))
    [span] = consumer_spans(exporter)
    assert span.parent is None and span.context.is_valid


def test_without_a_provider_the_consumer_span_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    # no provider installed (the API's proxy, whatever another module's tests installed): nothing recorded
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    headers = encode_record(completed(), context=(("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),))
    with consumer_span(headers.headers, topic=TOPIC, group="g", partition=0, offset=0) as span:
        assert not span.is_recording() and not span.get_span_context().is_valid
    # an explicit no-op tracer records nothing either
    with consumer_span((), topic=TOPIC, group="g", partition=0, offset=0, tracer=trace.NoOpTracer()) as span:
        assert not span.is_recording()


@pytest.mark.kafka
def test_over_the_broker_the_consumer_span_has_the_producers_trace_id(
    broker: LocalBroker, tmp_path: Path, spans: tuple[Tracer, InMemorySpanExporter]
) -> None:
    tracer, exporter = spans
    settings = fast_settings(broker.bootstrap, new_topic(), partitions=1)
    event, applier = completed(), TraceRecorder()

    async def scenario() -> list[Any]:
        publisher = KafkaPublisher(settings, tmp_path / "outbox.sqlite3")
        with tracer.start_as_current_span("request"):
            publisher.publish(event)  # before start(): the row waits in the outbox with its context
        await publisher.start()
        await publisher.flushed(timeout_s=30)
        await publisher.stop()
        runner = KafkaConsumerRunner(broker.bootstrap, settings.topic, "g", applier, tmp_path / "s",
                                     settings=settings, tracer=tracer)  # fmt: skip
        await runner.start()
        try:
            await wait_until(lambda: runner.counters.applied == 1)
        finally:
            await runner.stop()
        return await read_topic(broker.bootstrap, settings.topic, 1)

    [record] = asyncio.run(scenario())
    [request] = [s for s in exporter.get_finished_spans() if s.name == "request"]
    trace_id = request.context.trace_id
    # the record carries the request's traceparent; the consumer span and the apply are in its trace
    assert header(record.headers, "traceparent") is not None
    assert f"{trace_id:032x}".encode() in (header(record.headers, "traceparent") or b"")
    [span] = consumer_spans(exporter)
    assert span.context.trace_id == trace_id and applier.trace_ids == [trace_id]
