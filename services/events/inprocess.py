"""The in-process event bus: the embedded default (one process, no durability).

Publish enqueues a copy; one background task applies each event to every subscriber of its stream,
in publish order across streams (and across the message types one stream carries). One process is
one replica: ``every_replica`` changes nothing here. Events are queued as Kafka's records are
(``events.records``: the bare protobuf, its type in a header), without trace context: the applier runs
on the bus's task, and nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from dataclasses import dataclass, field

from lookahead_rag.services.events.protocols import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    BusStats,
    ConsumerCounters,
    DeadLetter,
    EventApplier,
    apply_with_retries,
    error_text,
)
from lookahead_rag.services.events.records import Record, encode_record, parse_record
from lookahead_rag.services.events.streams import GENERATIONS, Event, Stream, stream_of

log = logging.getLogger(__name__)

DRAIN_ON_STOP_S = 10.0  # stop() waits this long for queued events before dropping them


@dataclass
class _Subscriber:
    group: str
    applier: EventApplier
    stream: Stream
    counters: ConsumerCounters = field(default_factory=ConsumerCounters)


class InProcessBus:
    """Publish enqueues; one background task applies each event to every subscriber, in order."""

    def __init__(
        self, max_attempts: int = DEFAULT_MAX_ATTEMPTS, retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    ) -> None:
        self._max_attempts = max_attempts
        self._backoff_s = retry_backoff_s
        self._queue: asyncio.Queue[tuple[Stream, Record]] = asyncio.Queue()
        self._subscribers: dict[str, _Subscriber] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self.dead_letters: list[DeadLetter] = []

    # --- publisher side ---
    def publish(self, event: Event) -> None:
        """Enqueue a copy of the event; safe from the loop thread and from other threads."""
        item = (stream_of(event), encode_record(event))  # a copy: the caller may reuse its message
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        else:
            self._queue.put_nowait(item)

    # --- consumer side ---
    def subscribe(
        self, group: str, applier: EventApplier, *, stream: Stream = GENERATIONS, every_replica: bool = False
    ) -> None:
        if group in self._subscribers:
            raise ValueError(f"group {group!r} already has an applier")
        self._subscribers[group] = _Subscriber(group, applier, stream)

    def counters(self, group: str) -> ConsumerCounters:
        counters = self._subscribers[group].counters
        counters.lag = self._queue.qsize()
        return counters

    def stats(self) -> BusStats:
        """Each group's counters (copies); no outbox."""
        return BusStats({group: dataclasses.replace(self.counters(group)) for group in list(self._subscribers)})

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
            stream, record = await self._queue.get()
            try:
                for sub in list(self._subscribers.values()):
                    if sub.stream is stream:
                        await self._deliver(sub, parse_record(stream, record.value, record.headers))
            finally:
                self._queue.task_done()

    async def _deliver(self, sub: _Subscriber, event: Event) -> None:
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

