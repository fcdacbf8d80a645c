"""The feedback-loop event bus: its interfaces and the small types both buses share.

The generator publishes one ``GenerationCompleted`` per finished answer; the draft cache and the
retriever each subscribe an *applier* under their own group name. The retriever's Forget publishes a
``ForgetRequested`` on the same stream (ordered with the tenant's answers): those appliers receive
either type, and the generator subscribes too (its prefix KV; ``events.forget``). A bus carries several streams
(``events.streams``): the retriever also publishes and consumes ``DocumentChanged``.
``events.inprocess`` holds the embedded default (one process, no durability),
``events.kafka.bus`` the same interface over Kafka; ``events.factory.make_bus`` picks one.

Appliers are called one event at a time, in publish order per group (per key with Kafka). A group
subscribed ``every_replica`` reads every event in each process that subscribes it (replicas that
each hold a full copy of the state); otherwise the processes of one group share the events.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from lookahead_rag.services.events.streams import GENERATIONS, Event, Stream

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 3  # apply attempts before an event is dead-lettered
DEFAULT_RETRY_BACKOFF_S = 0.0  # pause between attempts (in-process: nothing to wait for)
ERROR_TEXT_LIMIT = 500  # characters of an exception kept in a dead-letter record

# Logical consumer names the services subscribe with (KafkaSettings.group_id maps them to Kafka groups).
DRAFTCACHE_GROUP = "draftcache"
RETRIEVER_GROUP = "retriever"  # past sessions (GenerationCompleted)
RETRIEVER_DOCUMENTS_GROUP = "retriever-documents"  # tenant documents (DocumentChanged)
GENERATOR_GROUP = "generator"  # prefix KV forgets (ForgetRequested; every replica)


class StaleSnapshot(Exception):
    """``restore()``: the saved snapshot does not describe the applier's own persisted state (kept
    outside the snapshot); the consumer then drops the saved offsets and reads its log from the
    beginning, which an applier idempotent by state makes safe."""


@runtime_checkable
class EventApplier(Protocol):
    """A consumer's state machine: idempotent (by event id, or by the state an event sets), snapshot-able."""

    def apply(self, event: Event) -> bool:
        """Apply the event; False when it changed nothing (its event_id was already applied).

        All or nothing: raise before changing anything (a raising apply is retried, then the
        event is dead-lettered).
        """
        ...

    def snapshot(self) -> bytes:
        """The full state, including which event ids were applied (or a fingerprint of a state the
        applier persists itself: see StaleSnapshot)."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's (or raise StaleSnapshot: see there)."""
        ...


@runtime_checkable
class ChangeCounter(Protocol):
    """An applier whose state also changes outside its events (the draft cache's AddOutput): ``changes``
    moves with every change, and a consumer saves its snapshot when it moved as when events were applied,
    so restoring that snapshot at the next start never drops those changes."""

    @property
    def changes(self) -> int:
        """A counter bumped by every change of the state, by an event or not."""
        ...


class EventPublisher(Protocol):
    """What the generator needs: a cheap, non-blocking publish."""

    def publish(self, event: Event) -> None:
        """Queue the event on its stream (``stream_of(event)``); never waits on a broker."""
        ...


class EventBus(EventPublisher, Protocol):
    """Publisher plus consumers; the in-process and the Kafka bus both satisfy it."""

    def subscribe(
        self, group: str, applier: EventApplier, *, stream: Stream = GENERATIONS, every_replica: bool = False
    ) -> None:
        """Feed ``stream``'s events to ``applier`` as consumer ``group``; ``every_replica``: each process
        reads all of them (its own Kafka group id per replica) instead of sharing them."""
        ...

    def counters(self, group: str) -> ConsumerCounters: ...

    def stats(self) -> BusStats:
        """What metrics sample: every group's counters and the outbox (cheap; safe from any thread)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait until everything published so far has been applied by every subscriber."""
        ...


@dataclass
class ConsumerCounters:
    """Per-consumer counters, for metrics."""

    applied: int = 0  # apply() returned True
    duplicates: int = 0  # apply() returned False: event id already in the state
    dead_lettered: int = 0  # gave up after the attempts, or undecodable
    apply_errors: int = 0  # failed apply attempts (retried or dead-lettered)
    redelivered: int = 0  # records re-read after a log reset / restart replay
    lag: int = 0  # events published but not yet applied (Kafka: sum over partitions)


@dataclass(frozen=True)
class OutboxStats:
    """The Kafka publisher's durable outbox."""

    depth: int  # events stored but not yet acknowledged by the broker
    sent: int  # events the broker acknowledged since this publisher started (a running total)
    set_aside: int = 0  # events the broker can never take, set aside since it started (a running total)


@dataclass(frozen=True)
class BusStats:
    """A bus's own report, for metrics: ``EventBus.stats()``."""

    consumers: dict[str, ConsumerCounters] = field(default_factory=dict)  # group -> a copy of its counters
    outbox: OutboxStats | None = None  # None: no outbox (in-process bus; Kafka bus not started)


@dataclass(frozen=True)
class DeadLetter:
    """An event the bus gave up on."""

    group: str
    event_id: str
    error: str
    attempts: int


@dataclass(frozen=True)
class ApplyOutcome:
    applied: bool  # the applier's answer (False = duplicate); meaningless when error is set
    error: Exception | None  # last error when every attempt failed
    attempts: int


async def apply_with_retries(
    applier: EventApplier, event: Event, max_attempts: int, backoff_s: float
) -> ApplyOutcome:
    """Call ``applier.apply`` up to ``max_attempts`` times; never raises an ``Exception``.

    The apply runs in a worker thread (appliers are thread-safe): embedding a past session or
    pruning a trie must not stall the event loop that serves gRPC streams.
    """
    error: Exception | None = None
    for attempt in range(1, max_attempts + 1):
        try:
            applied = await asyncio.to_thread(applier.apply, event)
            return ApplyOutcome(applied=bool(applied), error=None, attempts=attempt)
        except Exception as exc:  # an applier bug must not stop the bus
            error = exc
            log.warning(
                "apply of event %s failed (attempt %d/%d): %r", event.event_id, attempt, max_attempts, exc
            )
            if attempt < max_attempts and backoff_s > 0:
                await asyncio.sleep(backoff_s)
    return ApplyOutcome(applied=False, error=error, attempts=max_attempts)


def error_text(exc: BaseException) -> str:
    return repr(exc)[:ERROR_TEXT_LIMIT]
