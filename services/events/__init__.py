"""The feedback-loop event bus: protocols and shared types here, the buses in submodules.

- ``services.events.inprocess``: ``InProcessBus``, the embedded default;
- ``services.events.kafka``: ``KafkaBus`` (outbox + publisher, one consumer runner per group);
- ``services.events.factory``: ``make_bus(settings, data_dir)`` picks one from ``KafkaSettings``;
- ``services.events.metrics``: consumer and outbox metrics, sampled from ``EventBus.stats()``.

Nothing in this package imports a service package (retriever, draft cache, generator).
"""

from services.events.protocols import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DRAFTCACHE_GROUP,
    ERROR_TEXT_LIMIT,
    RETRIEVER_GROUP,
    ApplyOutcome,
    BusStats,
    ConsumerCounters,
    DeadLetter,
    EventApplier,
    EventBus,
    EventPublisher,
    OutboxStats,
    apply_with_retries,
    error_text,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_BACKOFF_S",
    "DRAFTCACHE_GROUP",
    "ERROR_TEXT_LIMIT",
    "RETRIEVER_GROUP",
    "ApplyOutcome",
    "BusStats",
    "ConsumerCounters",
    "DeadLetter",
    "EventApplier",
    "EventBus",
    "EventPublisher",
    "OutboxStats",
    "apply_with_retries",
    "error_text",
]
