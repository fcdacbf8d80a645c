"""``make_bus``: the in-process bus or the Kafka bus, from ``KafkaSettings`` (same interface)."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.trace import Tracer

from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.protocols import EventBus


def make_bus(settings: KafkaSettings, data_dir: Path, tracer: Tracer | None = None) -> EventBus:
    """The in-process bus when no bootstrap server is set, the Kafka bus otherwise (same interface);
    ``tracer``: the Kafka consumers' spans (None: OpenTelemetry's global provider)."""
    if not settings.enabled:
        return InProcessBus(
            max_attempts=settings.dlt_max_attempts, retry_backoff_s=settings.apply_retry_backoff_s
        )
    return KafkaBus(settings, Path(data_dir), tracer)
