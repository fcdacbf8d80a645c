"""W3C trace context across the bus: injected into a record's headers at publish, extracted by the consumer.

Only the OpenTelemetry *API* is used here: whoever runs the process installs a tracer provider and
its exporters (``services.common.telemetry.tracing``). With none installed, ``context_headers`` finds no valid
span and returns nothing, and ``consumer_span`` neither parses the headers nor opens a span: a few
microseconds per event.

The publisher calls ``context_headers()`` in the publishing thread (its active span is the request's)
and stores the headers with the event in the outbox, so a later send, even after a restart, carries the
request's context. The consumer applies each record inside ``consumer_span``: a CONSUMER span whose parent
is the extracted context, so the consumer's work (and any span its applier opens) joins the request's trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Tracer

TRACER = trace.get_tracer(__name__)  # a proxy: it follows the provider installed later, if any

MESSAGING_SYSTEM = "kafka"  # messaging.system of the spans (OpenTelemetry messaging conventions)
PROCESS_OPERATION = "process"  # messaging.operation.type of a consumer's apply


def context_headers() -> tuple[tuple[str, bytes], ...]:
    """The current trace context as record headers (``traceparent``, ``tracestate``, ``baggage``), by the
    globally configured propagator; empty outside a span (and when no tracer provider is installed)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple((name, value.encode()) for name, value in carrier.items())


def _carrier(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    """Record headers as a propagator carrier (the propagator only reads the names it knows)."""
    fields = propagate.get_global_textmap().fields
    return {name: bytes(value or b"").decode(errors="replace") for name, value in headers or () if name in fields}


@contextmanager
def consumer_span(
    headers: Sequence[tuple[str, bytes]] | None,
    *,
    topic: str,
    group: str,
    partition: int,
    offset: int,
    tracer: Tracer | None = None,
) -> Iterator[Span]:
    """A CONSUMER span ``process <topic>`` current for the block, child of the context the record's
    headers carry (a new trace when they carry none); with no tracer given and no provider installed,
    the invalid span (nothing recorded, nothing parsed)."""
    if tracer is None and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield trace.INVALID_SPAN
        return
    parent = propagate.extract(_carrier(headers))
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": PROCESS_OPERATION,
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": group,
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
    }
    with (tracer or TRACER).start_as_current_span(
        f"{PROCESS_OPERATION} {topic}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span
