"""Metrics of the event bus: its consumers and the Kafka outbox, sampled from ``EventBus.stats()``.

Gauges and counters sampled from the bus (each group's counters and lag, the outbox depth and
acknowledged total) are kept current by ``lookahead_rag.services.common.telemetry.refresher.Refresher`` running
``consumer_jobs`` and ``outbox_job``; an event applier wrapped in ``ObservedApplier`` records each
event's age when it is applied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.telemetry.metric_group import LATENCY_BUCKETS, MetricGroup
from lookahead_rag.services.events.protocols import ChangeCounter, ConsumerCounters, EventApplier, EventBus
from lookahead_rag.v1 import events_pb2


class ConsumerMetrics(MetricGroup):
    """Event consumers, labelled by logical consumer name ("draftcache", "retriever")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.lag = self.gauge(
            "consumer_lag_events", "events published but not yet applied (Kafka: summed over partitions)",
            ("consumer",),
        )
        self.event_age = self.histogram(
            "consumer_event_age_seconds", "event creation to applied", LATENCY_BUCKETS, ("consumer",)
        )
        self.applied = self.counter("consumer_applied_events", "events applied to the state", ("consumer",))
        self.redelivered = self.counter(
            "consumer_redelivered_events", "events seen again and skipped (already applied, by event id)",
            ("consumer",),
        )
        self.replayed = self.counter(
            "consumer_replayed_records", "records read again after a log reset or a restart's replay",
            ("consumer",),
        )
        self.apply_errors = self.counter(
            "consumer_apply_errors", "failed apply attempts (retried, or dead-lettered at the last)", ("consumer",)
        )
        self.dead_lettered = self.counter(
            "consumer_dead_lettered_events", "events sent to the dead-letter topic", ("consumer",)
        )
        self._seen: dict[str, tuple[int, ...]] = {}  # consumer -> totals at the last observe_counters
        self._lock = threading.Lock()

    def set_lag(self, consumer: str, lag: int) -> None:
        self.lag.labels(consumer).set(lag)

    def record_applied(self, consumer: str, count: int = 1, age_s: float | None = None) -> None:
        self.applied.labels(consumer).inc(count)
        if age_s is not None:
            self.record_age(consumer, age_s)

    def record_age(self, consumer: str, age_s: float) -> None:
        self.event_age.labels(consumer).observe(max(age_s, 0.0))

    def record_redelivered(self, consumer: str, count: int = 1) -> None:
        self.redelivered.labels(consumer).inc(count)

    def record_dead_lettered(self, consumer: str, count: int = 1) -> None:
        self.dead_lettered.labels(consumer).inc(count)

    def observe_counters(self, consumer: str, counters: ConsumerCounters) -> None:
        """Bring the counters up to a bus's running totals (adds what moved since the last call; a
        total that went down means the bus restarted its count, so all of it is new) and set the lag."""
        totals = (counters.applied, counters.duplicates, counters.redelivered, counters.apply_errors,
                  counters.dead_lettered)
        with self._lock:
            before = self._seen.get(consumer, (0,) * len(totals))
            self._seen[consumer] = totals
        metrics = (self.applied, self.redelivered, self.replayed, self.apply_errors, self.dead_lettered)
        for metric, now, then in zip(metrics, totals, before, strict=True):
            moved = moved_since(now, then)
            if moved:
                metric.labels(consumer).inc(moved)
            else:
                metric.labels(consumer)  # exported at 0 from the first sample
        self.set_lag(consumer, counters.lag)


def moved_since(total: int, seen: int) -> int:
    """How far a running total moved since it was ``seen`` (a total that went down restarted its count)."""
    return total - seen if total >= seen else total


class OutboxMetrics(MetricGroup):
    """The producer's durable outbox."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.depth = self.gauge("outbox_depth", "events stored but not yet acknowledged by Kafka")
        self.sent = self.counter("outbox_sent_events", "events Kafka acknowledged")
        self.set_aside = self.counter(
            "outbox_set_aside_events", "events Kafka can never take (too large), moved out of the outbox's way"
        )
        self._seen_sent = 0
        self._seen_set_aside = 0

    def set_depth(self, depth: int) -> None:
        self.depth.set(depth)

    def record_sent(self, count: int = 1) -> None:
        self.sent.inc(count)

    def observe_sent_total(self, total: int) -> None:
        """Bring ``sent`` up to a flusher's running total (see ConsumerMetrics.observe_counters)."""
        moved, self._seen_sent = moved_since(total, self._seen_sent), total
        if moved:
            self.sent.inc(moved)

    def observe_set_aside_total(self, total: int) -> None:
        """Bring ``set_aside`` up to a flusher's running total (as ``observe_sent_total``)."""
        moved, self._seen_set_aside = moved_since(total, self._seen_set_aside), total
        if moved:
            self.set_aside.inc(moved)


def consumer_jobs(bus: EventBus, groups: Iterable[str], metrics: ConsumerMetrics) -> list[Callable[[], None]]:
    """Refresher jobs bringing ConsumerMetrics up to the counters ``bus.stats()`` reports for each group."""
    return [lambda g=group: metrics.observe_counters(g, bus.stats().consumers[g]) for group in groups]


def outbox_job(bus: EventBus, metrics: OutboxMetrics) -> Callable[[], None]:
    """A Refresher job sampling a bus's outbox (``bus.stats().outbox``): its depth and the events Kafka
    acknowledged; nothing while the bus has no outbox open."""

    def sample() -> None:
        outbox = bus.stats().outbox
        if outbox is not None:
            metrics.set_depth(outbox.depth)
            metrics.observe_sent_total(outbox.sent)
            metrics.observe_set_aside_total(outbox.set_aside)

    return sample


class ObservedApplier:
    """An EventApplier seen by metrics: each applied event's age goes to ConsumerMetrics,
    ``on_applied(event)`` and ``on_restore()`` let state-size gauges know what changed.
    Counts come from the bus's own counters (Refresher + ConsumerMetrics.observe_counters)."""

    def __init__(self, applier: EventApplier, consumer: str, metrics: ConsumerMetrics,
                 on_applied: Callable[[events_pb2.GenerationCompleted], None] | None = None,
                 on_restore: Callable[[], None] | None = None) -> None:
        self.applier = applier
        self.consumer = consumer
        self.metrics = metrics
        self._on_applied = on_applied
        self._on_restore = on_restore

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        applied = bool(self.applier.apply(event))
        if applied:
            if event.created_unix_ms:
                self.metrics.record_age(self.consumer, time.time() - event.created_unix_ms / 1000.0)
            if self._on_applied is not None:
                self._on_applied(event)
        return applied

    @property
    def changes(self) -> int:
        """The wrapped applier's change counter (``ChangeCounter``; 0 when it keeps none)."""
        return self.applier.changes if isinstance(self.applier, ChangeCounter) else 0

    def snapshot(self) -> bytes:
        return bytes(self.applier.snapshot())

    def restore(self, data: bytes) -> None:
        self.applier.restore(data)
        if self._on_restore is not None:
            self._on_restore()
