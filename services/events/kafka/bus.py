"""``KafkaBus``: the ``EventBus`` over Kafka, a ``KafkaPublisher`` per stream plus one consumer runner per group.

``KafkaBus`` has the in-process bus's interface (publish, subscribe(group, applier), start, stop,
drain, counters, stats), so services do not care which one ``make_bus`` gave them. Each stream
(``lookahead_rag.services.events.streams``) has its topic and its outbox (``topics``); a group subscribed
``every_replica`` reads all partitions in every process (``replica_consumer``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from pathlib import Path

from opentelemetry.trace import Tracer

from lookahead_rag.services.events.kafka.cluster_offsets import log_end_offsets
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.replica_consumer import EveryPartitionRunner
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.topics import stream_outbox_path, stream_settings
from lookahead_rag.services.events.protocols import BusStats, ConsumerCounters, EventApplier, OutboxStats
from lookahead_rag.services.events.streams import GENERATIONS, Event, Stream, stream_of

log = logging.getLogger(__name__)


class KafkaBus:
    """Publishers plus one consumer runner per subscribed group; same interface as ``InProcessBus``."""

    def __init__(self, settings: KafkaSettings, data_dir: Path, tracer: Tracer | None = None) -> None:
        """``tracer``: the consumers' spans (None: OpenTelemetry's global provider, if one is installed)."""
        self.settings = settings
        self.tracer = tracer
        self.data_dir = Path(data_dir)
        self.runners: dict[str, KafkaConsumerRunner] = {}
        self._publishers: dict[str, KafkaPublisher] = {}  # stream name -> its publisher (opened on first use)
        self._publishers_lock = threading.Lock()  # publish() may run in worker threads
        self._streams: dict[str, Stream] = {GENERATIONS.name: GENERATIONS}  # start() opens their publishers
        self._started = False

    @property
    def publisher(self) -> KafkaPublisher:
        """The GENERATIONS publisher (opened on first use)."""
        return self.publisher_for(GENERATIONS)

    def publisher_for(self, stream: Stream) -> KafkaPublisher:
        """The stream's publisher: its own outbox file, sending to its topic under its key."""
        with self._publishers_lock:
            publisher = self._publishers.get(stream.name)
            if publisher is None:
                outbox = stream_outbox_path(self.settings, stream, self.data_dir)
                publisher = KafkaPublisher(stream_settings(self.settings, stream), outbox, stream=stream)
                self._publishers[stream.name] = publisher
            return publisher

    def publish(self, event: Event) -> None:
        self.publisher_for(stream_of(event)).publish(event)

    def subscribe(
        self, group: str, applier: EventApplier, *, stream: Stream = GENERATIONS, every_replica: bool = False
    ) -> None:
        """Consume ``stream``'s topic as Kafka group ``settings.group_id(group)`` (its share of the
        partitions), or with ``every_replica`` all partitions under ``settings.replica_group_id(group)``.
        Call before start(). start() opens the stream's publisher too (GENERATIONS' always): a process
        holding a stream's state also publishes changes to it, and what a previous run left in that
        outbox is resent."""
        if self._started:
            raise RuntimeError("KafkaBus.subscribe() after start()")
        if group in self.runners:
            raise ValueError(f"group {group!r} already has an applier")
        s = stream_settings(self.settings, stream)
        state_dir = s.resolved_state_dir(self.data_dir)
        if every_replica:
            runner_class, group_id, state_name = EveryPartitionRunner, s.replica_group_id(group), group
        else:
            runner_class, group_id, state_name = KafkaConsumerRunner, s.group_id(group), None
        self.runners[group] = runner_class(
            s.bootstrap_servers, s.topic, group_id, applier, state_dir, settings=s, stream=stream,
            state_name=state_name, tracer=self.tracer,
        )  # fmt: skip
        self._streams[stream.name] = stream

    def counters(self, group: str) -> ConsumerCounters:
        return self.runners[group].counters

    def stats(self) -> BusStats:
        """Each group's counters (copies) and the outboxes' depth and acknowledged total, summed over the
        streams (the outbox: None while no publisher is open, i.e. before the first publish/start or
        after stop; a metrics read never opens one)."""
        consumers = {group: dataclasses.replace(runner.counters) for group, runner in self.runners.items()}
        outboxes = [publisher.stats() for publisher in list(self._publishers.values())]
        if not outboxes:
            return BusStats(consumers, None)
        return BusStats(consumers, OutboxStats(sum(o.depth for o in outboxes), sum(o.sent for o in outboxes),
                                               sum(o.set_aside for o in outboxes)))

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        for stream in self._streams.values():
            self.publisher_for(stream)
        for publisher in list(self._publishers.values()):
            await publisher.start()
        for runner in self.runners.values():
            await runner.start()

    async def stop(self) -> None:
        """Flush the outboxes (bounded), then stop each consumer gracefully (commit + snapshot)."""
        if not self._started:
            return
        with self._publishers_lock:
            publishers, self._publishers = self._publishers, {}
        for publisher in publishers.values():
            await publisher.stop()
        for runner in self.runners.values():
            await runner.stop()
        self._started = False

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait until the outboxes are empty and every group has applied everything in its topic."""

        async def _drain() -> None:
            self.publisher_for(GENERATIONS)  # as before: drain() opens it when it is not
            for publisher in list(self._publishers.values()):
                await publisher.flushed()
            ends_of: dict[str, tuple[str, dict[int, int]]] = {}
            for runner in self.runners.values():
                if runner.topic not in ends_of:
                    ends_of[runner.topic] = await log_end_offsets(runner.settings)
                await runner.wait_caught_up(*ends_of[runner.topic])

        await asyncio.wait_for(_drain(), timeout_s)
