"""One consumer group feeding one applier from Kafka: apply, commit, snapshot, dead-letter.

Recovery = snapshot + offset. The runner keeps, per partition, the next offset to apply; it writes
the applier's snapshot together with those offsets in one atomic file (every N events or T seconds,
before partitions are revoked, on stop). On start it restores the applier from that file and, when
partitions are assigned, seeks each to the saved offset (a partition it has never seen: to the
beginning). Whatever was applied after the last snapshot is lost with the process and applied again,
so a crash at any point loses nothing and applies nothing twice. Duplicate records in the log (a
resend after a lost acknowledgement) are dropped by the applier's event-id idempotence.

Offsets committed to Kafka after each batch (and on revoke) are for lag monitoring and tooling; the
saved offsets are what recovery trusts, because only they are guaranteed to match the snapshot.
Offsets are positions in one cluster's log: when the cluster id changes (the bundled tansu broker
restarts empty) the saved offsets are dropped and the log is read from the beginning; so are they when
the applier's ``restore`` raises ``StaleSnapshot`` (its own persisted state does not match the snapshot).

An applier whose state also changes outside its events (``ChangeCounter``: the draft cache's AddOutput)
has its snapshot saved when its counter moved too (on the same triggers, and on stop), so the state a
start restores holds those changes.

The group assigns this member its share of the partitions; ``replica_consumer.EveryPartitionRunner``
takes all of them instead (``_take_partitions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.structs import OffsetAndMetadata
from opentelemetry.trace import Tracer

from lookahead_rag.services.events.kafka.broker import ensure_topics
from lookahead_rag.services.events.kafka.cluster_offsets import cluster_view
from lookahead_rag.services.events.kafka.dead_letter import DeadLetterSender
from lookahead_rag.services.events.kafka.record_handler import RecordHandler
from lookahead_rag.services.events.kafka.security import client_security
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.state import ConsumerState, read_state, state_path, write_state
from lookahead_rag.services.events.kafka.topics import stream_configs
from lookahead_rag.services.events.protocols import ChangeCounter, ConsumerCounters, EventApplier, StaleSnapshot
from lookahead_rag.services.events.streams import GENERATIONS, Stream

log = logging.getLogger(__name__)

MS_PER_S = 1000
CAUGHT_UP_POLL_S = 0.02  # wait_caught_up() re-checks this often


class _Listener(ConsumerRebalanceListener):
    def __init__(self, runner: KafkaConsumerRunner) -> None:
        self._runner = runner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._runner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._runner._on_assigned(assigned)


class KafkaConsumerRunner:
    """Consumes ``topic`` as member of ``group`` and applies each event to ``applier``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        applier: EventApplier,
        state_dir: Path,
        *,
        settings: KafkaSettings | None = None,
        stream: Stream = GENERATIONS,
        state_name: str | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """``stream``: what the topic carries (how records decode); ``state_name``: the state file's
        name in ``state_dir`` (default: the group id); ``tracer``: the consumer spans' (default: the
        global provider's)."""
        base = settings or KafkaSettings()
        self.settings = base.model_copy(update={"bootstrap_servers": bootstrap, "topic": topic})
        self.topic = topic
        self.group = group
        self.applier = applier
        self.state_path = state_path(state_dir, state_name or group)
        self.counters = ConsumerCounters()
        self.snapshots_written = 0
        self.commits = 0
        self.commit_failures = 0
        self._positions: dict[int, int] = {}  # partition -> next offset to apply (= what the state covers)
        self._cluster_id = ""
        self._unsaved = 0  # events applied since the last saved state
        self._saved_changes = 0  # the applier's change counter (ChangeCounter) at the last save or restore
        self._last_save = time.monotonic()
        self._uncommitted: set[TopicPartition] = set()  # applied past the last commit
        self._last_commit = time.monotonic()
        self._lock = asyncio.Lock()  # one of: a batch, a rebalance callback, a save
        self._consumer: AIOKafkaConsumer | None = None
        self._stream = stream
        self._dlt = DeadLetterSender(self.settings, group)
        self._records = RecordHandler(
            applier, self._dlt, self.counters, self.settings.dlt_max_attempts, self.settings.apply_retry_backoff_s,
            stream, tracer,
        )
        self._resync = False  # the assignment callback failed: seek again before applying anything
        self._task: asyncio.Task[None] | None = None
        self._assigned = asyncio.Event()
        self._generation = 0  # bumped by every seek; a batch fetched under an older one is dropped
        self._stopping = False  # the loop's exit flag: Python 3.11's wait_for can swallow a cancel

    # --- lifecycle ---
    async def start(self) -> None:
        """Restore the applier from the saved state and start consuming in the background."""
        if self._task is not None:
            return
        self._stopping = False
        state = read_state(self.state_path)
        if state is not None:
            try:
                self.applier.restore(state.snapshot)
            except StaleSnapshot as exc:
                log.warning("%s: %s; reading the log from the beginning", self.group, exc)
                state = None
        if state is not None:
            if state.topic == self.topic:
                self._positions = dict(state.offsets)
                self._cluster_id = state.cluster_id
            log.info("%s: restored state covering offsets %s", self.group, self._positions)
        self._saved_changes = self._changes()
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.group}")

    async def stop(self) -> None:
        """Graceful: finish the batch, commit, save snapshot+offsets, leave the group."""
        crashed = await self._end_task()
        try:
            if not crashed:
                async with self._lock:
                    if self._consumer is not None:
                        await self._commit(self._consumer.assignment())
                    if self._unsaved_changes():  # also when it never reached the broker: direct changes
                        await self._save()
        finally:
            await self._close_clients()

    async def kill(self) -> None:
        """Hard stop for tests and benchmarks: no commit, no snapshot (like a killed process)."""
        await self._end_task()
        await self._close_clients()

    async def wait_assigned(self, timeout_s: float | None = None) -> None:
        """Wait until the group gave this member its partitions."""
        await asyncio.wait_for(self._assigned.wait(), timeout_s)

    def caught_up(self, cluster: str, end_offsets: dict[int, int]) -> bool:
        """True when every record below ``end_offsets`` of ``cluster`` is in the applier's state."""
        if self._cluster_id != cluster:
            return False
        return all(self._positions.get(p, 0) >= end for p, end in end_offsets.items() if end > 0)

    async def wait_caught_up(
        self, cluster: str, end_offsets: dict[int, int], timeout_s: float | None = None
    ) -> None:
        async def _poll() -> None:
            while not self.caught_up(cluster, end_offsets):
                if self._task is None or self._task.done():
                    raise RuntimeError(f"consumer {self.group} is not running")
                await asyncio.sleep(CAUGHT_UP_POLL_S)

        await asyncio.wait_for(_poll(), timeout_s)

    @property
    def positions(self) -> dict[int, int]:
        return dict(self._positions)

    @property
    def running(self) -> bool:
        """False once stopped, killed, or dead of an error its loop could not handle."""
        return self._task is not None and not self._task.done()

    # --- the loop ---
    async def _run(self) -> None:
        backoff = self.settings.reconnect_backoff_s
        while not self._stopping:
            try:
                consumer = self._consumer or await self._connect()
                generation = self._generation
                batch = await consumer.getmany(
                    timeout_ms=self.settings.poll_timeout_ms, max_records=self.settings.max_poll_records
                )
                async with self._lock:
                    if self._resync:
                        await self._seek_assigned(consumer, consumer.assignment())
                    elif generation != self._generation:  # re-seeked during the fetch: drop the batch,
                        self._rewind()  # fetch again from what is applied
                    else:
                        await self._handle_batch(consumer, batch)
                    if self._save_due():  # the time-based trigger, also when no record came
                        await self._save()
                backoff = self.settings.reconnect_backoff_s
            except Exception as exc:  # broker gone, DLT unreachable, disk full: retry from what is applied
                log.warning("%s: %r; retrying in %.1f s", self.group, exc, backoff)
                async with self._lock:
                    self._rewind()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.reconnect_backoff_max_s)

    async def _connect(self) -> AIOKafkaConsumer:
        s = self.settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            group_id=self.group,
            client_id=f"{s.client_id}.{self.group}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
            max_poll_records=s.max_poll_records,
            **client_security(s),
        )
        try:
            if s.create_topics:  # before subscribing: a metadata request may auto-create it otherwise
                topics = {self.topic: s.partitions, s.dlt_topic: s.dlt_partitions}
                await ensure_topics(s.bootstrap_servers, topics, s.replication_factor, s.request_timeout_ms,
                                    security=client_security(s), configs=stream_configs(s, self._stream))
            await consumer.start()
            self._consumer = consumer
            await self._take_partitions(consumer)
        except BaseException:
            self._consumer = None
            await consumer.stop()
            raise
        return consumer

    async def _take_partitions(self, consumer: AIOKafkaConsumer) -> None:
        """Join the group: it assigns this member its share of the partitions (the listener seeks them)."""
        consumer.subscribe([self.topic], listener=_Listener(self))

    async def _handle_batch(
        self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list[ConsumerRecord]]
    ) -> None:
        assignment = consumer.assignment()
        for tp, records in batch.items():
            if tp not in assignment:  # revoked while this batch waited for the lock
                continue
            for record in records:
                await self._handle(record)
                self._uncommitted.add(tp)
                if self._save_due():
                    await self._save()
        if time.monotonic() - self._last_commit >= self.settings.commit_interval_s:
            await self._commit(self._uncommitted)
        self.counters.lag = self._lag(consumer)

    async def _handle(self, record: ConsumerRecord) -> None:
        expected = self._positions.get(record.partition)
        if expected is not None and record.offset < expected:
            self.counters.redelivered += 1  # the log was reset under us; the applier drops what it has
        await self._records.handle(record)
        self._positions[record.partition] = record.offset + 1
        self._unsaved += 1

    # --- commit, state ---
    async def _commit(self, partitions: Iterable[TopicPartition]) -> None:
        if self._consumer is None:
            return
        offsets = {
            tp: OffsetAndMetadata(self._positions[tp.partition], "")
            for tp in partitions
            if tp.topic == self.topic and tp.partition in self._positions
        }
        if not offsets:
            return
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), self.settings.commit_timeout_s)
        except Exception as exc:  # rebalanced or broker away: the saved state still covers recovery
            self.commit_failures += 1
            log.info("%s: commit failed: %r", self.group, exc)
        else:
            self.commits += 1
            self._uncommitted.difference_update(offsets)
        self._last_commit = time.monotonic()

    def _changes(self) -> int:
        return self.applier.changes if isinstance(self.applier, ChangeCounter) else 0

    def _unsaved_changes(self) -> bool:
        """Events applied, or the applier changed outside them, since the last save."""
        return self._unsaved > 0 or self._changes() != self._saved_changes

    def _save_due(self) -> bool:
        if self._unsaved >= self.settings.snapshot_every_events:
            return True
        return self._unsaved_changes() and time.monotonic() - self._last_save >= self.settings.snapshot_interval_s

    async def _save(self) -> None:
        """Write the applier's snapshot with the offsets it covers (caller holds the lock)."""
        changes = self._changes()  # before the snapshot: a change racing with it is saved next time
        snapshot = self.applier.snapshot()  # taken with the offsets, no await in between
        state = ConsumerState(self.topic, self.group, self._cluster_id, dict(self._positions), snapshot)
        await asyncio.to_thread(write_state, self.state_path, state)
        self._unsaved = 0
        self._saved_changes = changes
        self._last_save = time.monotonic()
        self.snapshots_written += 1

    def _rewind(self) -> None:
        """After an error mid-batch: fetch again from what is applied."""
        if self._consumer is None:
            return
        for tp in self._consumer.assignment():
            if tp.partition in self._positions:
                self._consumer.seek(tp, self._positions[tp.partition])
        self._generation += 1

    def _lag(self, consumer: AIOKafkaConsumer) -> int:
        lag = 0
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None:
                lag += max(0, high - self._positions.get(tp.partition, 0))
        return lag

    # --- rebalance ---
    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._assigned.clear()
        async with self._lock:
            await self._commit(revoked)
            self._uncommitted.difference_update(revoked)
            if self._unsaved_changes():
                await self._save()

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        async with self._lock:
            self._resync = True
            try:
                await self._seek_assigned(consumer, assigned)
            except Exception as exc:  # the loop seeks again before it applies anything
                log.warning("%s: seeking the assigned partitions failed: %r", self.group, exc)
        self._assigned.set()

    async def _seek_assigned(self, consumer: AIOKafkaConsumer, assigned: Iterable[TopicPartition]) -> None:
        """Seek each partition to what the state covers (a partition it never saw: its first offset)."""
        await self._check_cluster()
        mine = [tp for tp in assigned if tp.topic == self.topic]
        unseen = [tp for tp in mine if tp.partition not in self._positions]
        if unseen:
            timeout_s = self.settings.request_timeout_ms / MS_PER_S
            starts = await asyncio.wait_for(consumer.beginning_offsets(unseen), timeout_s)
            self._positions.update({tp.partition: off for tp, off in starts.items()})
        for tp in mine:
            consumer.seek(tp, self._positions[tp.partition])
        self._generation += 1
        self._resync = False
        log.info("%s: assigned, starting at %s", self.group, self._positions)

    async def _check_cluster(self) -> None:
        try:
            timeout_s = self.settings.commit_timeout_s
            current, _ = await cluster_view(self.settings.bootstrap_servers, self.topic, timeout_s,
                                            security=client_security(self.settings))
        except Exception as exc:
            log.warning("%s: cannot read the cluster id (%r); keeping saved offsets", self.group, exc)
            return
        if self._cluster_id and current != self._cluster_id:
            log.warning("%s: cluster %s replaced by %s: saved offsets dropped, reading from the beginning",
                        self.group, self._cluster_id, current)  # fmt: skip
            self._positions.clear()
        self._cluster_id = current

    # --- shutdown ---
    async def _end_task(self) -> bool:
        """Stop the loop; True when it had died of an error (its state may be half-applied)."""
        task, self._task = self._task, None
        if task is None:
            return False
        self._stopping = True
        task.cancel()
        await asyncio.wait([task])
        crashed = not task.cancelled() and task.exception() is not None
        if crashed:
            log.error("%s: consumer loop died: %r", self.group, task.exception())
        return crashed

    async def _close_clients(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), self.settings.shutdown_timeout_s)
        await self._dlt.stop()
        self._assigned.clear()
