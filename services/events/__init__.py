"""The feedback-loop event bus: protocols and shared types here, the buses in submodules.

- ``services.events.inprocess``: ``InProcessBus``, the embedded default;
- ``services.events.kafka``: ``KafkaBus`` (outbox + publisher, one consumer runner per group);
- ``services.events.factory``: ``make_bus(settings, data_dir)`` picks one from ``KafkaSettings``;
- ``services.events.metrics``: consumer and outbox metrics, sampled from ``EventBus.stats()``;
- ``services.events.streams``: the event kinds a bus carries (``GENERATIONS``, ``DOCUMENTS``) and their keys.
- ``services.events.forget``: ``ForgetRequested`` (on ``GENERATIONS``): its builder and the consumers' ledger.

Nothing in this package imports a service package (retriever, draft cache, generator).
"""

from services.events.protocols import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DRAFTCACHE_GROUP,
    ERROR_TEXT_LIMIT,
    GENERATOR_GROUP,
    RETRIEVER_DOCUMENTS_GROUP,
    RETRIEVER_GROUP,
    ApplyOutcome,
    BusStats,
    ConsumerCounters,
    DeadLetter,
    EventApplier,
    EventBus,
    EventPublisher,
    OutboxStats,
    StaleSnapshot,
    apply_with_retries,
    error_text,
)
from services.events.streams import DOCUMENTS, GENERATIONS, Event, Stream, stream_of

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_BACKOFF_S",
    "DOCUMENTS",
    "DRAFTCACHE_GROUP",
    "ERROR_TEXT_LIMIT",
    "GENERATIONS",
    "GENERATOR_GROUP",
    "RETRIEVER_DOCUMENTS_GROUP",
    "RETRIEVER_GROUP",
    "ApplyOutcome",
    "BusStats",
    "ConsumerCounters",
    "DeadLetter",
    "Event",
    "EventApplier",
    "EventBus",
    "EventPublisher",
    "OutboxStats",
    "StaleSnapshot",
    "Stream",
    "apply_with_retries",
    "error_text",
    "stream_of",
]
