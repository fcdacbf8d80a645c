"""The feedback-loop event bus: protocols and shared types here, the buses in submodules.

- ``events.inprocess``: ``InProcessBus``, the embedded default;
- ``events.kafka``: ``KafkaBus`` (outbox + publisher, one consumer runner per group);
- ``events.factory``: ``make_bus(settings, data_dir)`` picks one from ``KafkaSettings``;
- ``events.metrics``: consumer and outbox metrics, sampled from ``EventBus.stats()``;
- ``events.streams``: the event kinds a bus carries (``GENERATIONS``, ``DOCUMENTS``) and their keys.
- ``events.forget``: ``ForgetRequested`` (on ``GENERATIONS``): its builder and the consumers' ledger.

Nothing in this package imports a service package (retriever, draft cache, generator).
"""

from lookahead_rag.services.events.protocols import (
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
from lookahead_rag.services.events.streams import DOCUMENTS, GENERATIONS, Event, Stream, stream_of

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
