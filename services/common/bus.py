"""The feedback-loop event bus: its interfaces and the in-process implementation.

The generator publishes one ``GenerationCompleted`` per finished answer; the draft cache and the
retriever each subscribe an *applier* under their own group name. ``InProcessBus`` is the embedded
default (one process, no durability); ``services.common.kafka_bus.KafkaBus`` is the same interface
over Kafka. ``services.common.kafka_settings.make_bus`` picks one.

Appliers are called on the event loop thread, one event at a time, in publish order per group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from lookahead_rag.v1 import events_pb2

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 3  # apply attempts before an event is dead-lettered
DEFAULT_RETRY_BACKOFF_S = 0.0  # pause between attempts (in-process: nothing to wait for)
ERROR_TEXT_LIMIT = 500  # characters of an exception kept in a dead-letter record
DRAIN_ON_STOP_S = 10.0  # stop() waits this long for queued events before dropping them


@runtime_checkable
class EventApplier(Protocol):
    """A consumer's state machine: idempotent by event id, snapshot-able."""

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        """Apply the event; False when its event_id was already applied (state unchanged).

        All or nothing: raise before changing anything (a raising apply is retried, then the
        event is dead-lettered).
        """
        ...

    def snapshot(self) -> bytes:
        """The full state, including which event ids were applied."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's."""
        ...


class EventPublisher(Protocol):
    """What the generator needs: a cheap, non-blocking publish."""

    def publish(self, event: events_pb2.GenerationCompleted) -> None: ...


class EventBus(EventPublisher, Protocol):
    """Publisher plus consumers; the in-process and the Kafka bus both satisfy it."""

    def subscribe(self, group: str, applier: EventApplier) -> None: ...

    def counters(self, group: str) -> ConsumerCounters: ...

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
    applier: EventApplier, event: events_pb2.GenerationCompleted, max_attempts: int, backoff_s: float
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


@dataclass
class _Subscriber:
    group: str
    applier: EventApplier
    counters: ConsumerCounters = field(default_factory=ConsumerCounters)


class InProcessBus:
    """Publish enqueues; one background task applies each event to every subscriber, in order."""

    def __init__(
        self, max_attempts: int = DEFAULT_MAX_ATTEMPTS, retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    ) -> None:
        self._max_attempts = max_attempts
        self._backoff_s = retry_backoff_s
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._subscribers: dict[str, _Subscriber] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self.dead_letters: list[DeadLetter] = []

    # --- publisher side ---
    def publish(self, event: events_pb2.GenerationCompleted) -> None:
        """Enqueue a copy of the event; safe from the loop thread and from other threads."""
        data = event.SerializeToString()  # a copy: the caller may reuse its message
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, data)
        else:
            self._queue.put_nowait(data)

    # --- consumer side ---
    def subscribe(self, group: str, applier: EventApplier) -> None:
        if group in self._subscribers:
            raise ValueError(f"group {group!r} already has an applier")
        self._subscribers[group] = _Subscriber(group, applier)

    def counters(self, group: str) -> ConsumerCounters:
        counters = self._subscribers[group].counters
        counters.lag = self._queue.qsize()
        return counters

    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._task = asyncio.create_task(self._run(), name="inprocess-bus")

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every event published so far went through every subscriber."""
        if self._task is None:
            raise RuntimeError("InProcessBus.drain() before start()")
        await asyncio.wait_for(self._queue.join(), timeout_s)

    async def stop(self) -> None:
        """Apply what is already queued, then stop the background task."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await self.drain(timeout_s=DRAIN_ON_STOP_S)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._loop = None

    async def _run(self) -> None:
        while True:
            data = await self._queue.get()
            try:
                for sub in list(self._subscribers.values()):
                    await self._deliver(sub, events_pb2.GenerationCompleted.FromString(data))
            finally:
                self._queue.task_done()

    async def _deliver(self, sub: _Subscriber, event: events_pb2.GenerationCompleted) -> None:
        outcome = await apply_with_retries(sub.applier, event, self._max_attempts, self._backoff_s)
        if outcome.error is not None:
            sub.counters.apply_errors += outcome.attempts
            sub.counters.dead_lettered += 1
            letter = DeadLetter(sub.group, event.event_id, error_text(outcome.error), outcome.attempts)
            self.dead_letters.append(letter)
            log.error("group %s: event %s dead-lettered: %s", sub.group, letter.event_id, letter.error)
        elif outcome.applied:
            sub.counters.applied += 1
            sub.counters.apply_errors += outcome.attempts - 1
        else:
            sub.counters.duplicates += 1

