"""Durable local outbox: events are written to SQLite on publish and sent to Kafka in the background.

A row leaves the outbox only after the broker acknowledged it (acks=all), so a broker outage or a
process restart loses nothing; a row whose acknowledgement was lost is sent again, and consumers
drop the duplicate by event id.

A row holds the record's key, value and headers (the event's type, its trace context: ``events.records``).
An outbox file of an older version has no ``headers`` column: opening it adds one, and its rows (headers
NULL: values in the pre-header format) go through the flusher's ``upgrade`` before they are sent.

A row the broker can never take (larger than the producer's ``max_request_size``, or refused by the
broker as too large when sent alone) is set aside: moved to the ``outbox_set_aside`` table of the same
file with its reason, logged at ERROR and counted, so every row behind it is still delivered. Nothing is
deleted: an operator can read it there (``sqlite3``), raise the limits and re-send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

log = logging.getLogger(__name__)

MS_PER_S = 1000
FLUSHED_POLL_S = 0.01  # flushed() re-checks the depth this often
REMOVE_SYNCHRONOUS = "NORMAL"  # removals: losing one to a power cut only causes a resend
BUSY_TIMEOUT_S = 5.0  # wait this long for the other connection's write lock
_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- send order
    key BLOB,                              -- Kafka key (tenant)
    value BLOB NOT NULL,                   -- serialized event
    created_ms INTEGER NOT NULL,           -- when it was appended
    headers TEXT                           -- record headers as JSON [[name, value]]; NULL: an old row
)
"""
_SET_ASIDE_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox_set_aside (
    id INTEGER PRIMARY KEY,                -- its id in outbox
    key BLOB,
    value BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    headers TEXT,
    reason TEXT NOT NULL,                  -- why it could not be sent
    set_aside_ms INTEGER NOT NULL          -- when it left the outbox
)
"""
_HEADERS_COLUMN = "headers"  # added to outbox files of versions before record headers
_ADD_HEADERS = f"ALTER TABLE outbox ADD COLUMN {_HEADERS_COLUMN} TEXT"
HEADER_TEXT_ERRORS = "surrogateescape"  # header bytes <-> JSON text, losslessly for any bytes

SIZE_ERRORS = (MessageSizeTooLargeError, RecordListTooLargeError)  # a record (or its batch) too large to send
Headers = tuple[tuple[str, bytes], ...]  # Kafka record headers (as events.records.Headers)


def headers_to_text(headers: Headers) -> str:
    """Headers as the JSON text stored in a row."""
    return json.dumps([[name, value.decode("utf-8", HEADER_TEXT_ERRORS)] for name, value in headers])


def headers_from_text(text: str | None) -> Headers | None:
    """A row's stored headers (None: a row written before headers existed)."""
    if text is None:
        return None
    return tuple((str(name), str(value).encode("utf-8", HEADER_TEXT_ERRORS)) for name, value in json.loads(text))


@dataclass(frozen=True)
class OutboxRow:
    id: int
    key: bytes | None
    value: bytes
    headers: Headers | None = None  # None: stored by a version before record headers (value in the old format)


class Outbox:
    """An append-only SQLite queue of (key, value) rows; thread-safe, one process at a time.

    Appends use the ``synchronous`` mode asked for (FULL: durable through power loss); removals
    use their own connection in NORMAL mode, since a removal lost to a power cut only means a
    resend, which consumers drop by event id.
    """

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._appender = self._connect(synchronous)
        self._appender.execute(_SCHEMA)
        self._appender.execute(_SET_ASIDE_SCHEMA)
        columns = {row[1] for row in self._appender.execute("PRAGMA table_info(outbox)")}
        if _HEADERS_COLUMN not in columns:  # an outbox file of an older version
            self._appender.execute(_ADD_HEADERS)
        self._remover = self._connect(REMOVE_SYNCHRONOUS)

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        return db

    def append(self, value: bytes, key: bytes | None = None, headers: Headers = ()) -> int:
        """Store one row durably (one small transaction); its id."""
        with self._lock:
            cur = self._appender.execute(
                "INSERT INTO outbox (key, value, created_ms, headers) VALUES (?, ?, ?, ?)",
                (key, value, int(time.time() * MS_PER_S), headers_to_text(headers)),
            )
            return int(cur.lastrowid or 0)

    def pending(self, limit: int) -> list[OutboxRow]:
        """The oldest ``limit`` rows not yet acknowledged, in append order."""
        with self._lock:
            cur = self._remover.execute("SELECT id, key, value, headers FROM outbox ORDER BY id LIMIT ?", (limit,))
            rows = cur.fetchall()
        return [OutboxRow(int(i), k, v, headers_from_text(h)) for i, k, v, h in rows]

    def remove(self, ids: Sequence[int]) -> None:
        """Forget acknowledged rows (one transaction)."""
        if not ids:
            return
        with self._lock:
            self._remover.execute("BEGIN")
            try:
                self._remover.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
            except BaseException:
                self._remover.execute("ROLLBACK")
                raise
            self._remover.execute("COMMIT")

    def set_aside(self, row_id: int, reason: str) -> None:
        """Move a row the broker can never take to ``outbox_set_aside`` (one transaction)."""
        with self._lock:
            self._remover.execute("BEGIN")
            try:
                self._remover.execute(
                    "INSERT OR REPLACE INTO outbox_set_aside (id, key, value, created_ms, headers, reason, "
                    "set_aside_ms) SELECT id, key, value, created_ms, headers, ?, ? FROM outbox WHERE id = ?",
                    (reason, int(time.time() * MS_PER_S), row_id),
                )
                self._remover.execute("DELETE FROM outbox WHERE id = ?", (row_id,))
            except BaseException:
                self._remover.execute("ROLLBACK")
                raise
            self._remover.execute("COMMIT")

    def depth(self) -> int:
        """Rows waiting for an acknowledgement."""
        with self._lock:
            return int(self._remover.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._remover.close()
            self._appender.close()


@dataclass
class FlusherCounters:
    sent: int = 0  # rows acknowledged by the broker and removed
    send_errors: int = 0  # failed flush rounds (broker unreachable, timeouts)
    set_aside: int = 0  # rows the broker can never take, moved out of the way (``Outbox.set_aside``)


@dataclass(frozen=True)
class FlusherConfig:
    batch_size: int  # rows per flush round
    poll_interval_s: float  # re-check period when nobody woke the flusher
    send_timeout_s: float  # one round's deadline
    backoff_s: float  # first pause after a failed round
    backoff_max_s: float  # longest pause
    stop_timeout_s: float  # graceful stop: time to flush what is pending


class OutboxFlusher:
    """Background task: sends pending outbox rows with an aiokafka producer, removes acknowledged ones."""

    def __init__(
        self,
        outbox: Outbox,
        topic: str,
        producer_factory: Callable[[], AIOKafkaProducer],
        config: FlusherConfig,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        upgrade: Callable[[OutboxRow], OutboxRow] | None = None,
    ) -> None:
        """``upgrade``: a row stored by an older version (headers None) in today's record format
        (default: sent as stored, without headers)."""
        self.outbox = outbox
        self.topic = topic
        self.counters = FlusherCounters()
        self._factory = producer_factory
        self._config = config
        self._on_connect = on_connect
        self._upgrade = upgrade
        self._producer: AIOKafkaProducer | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stopping = False  # the loop's exit flag: Python 3.11's wait_for can swallow a cancel
        self._suspects: set[int] = set()  # rows the broker refused as too large alongside others

    def wake(self) -> None:
        """Tell the flusher there is a new row (from any thread)."""
        if self._loop is None:
            return  # not started: start() looks at the outbox anyway
        if threading.get_ident() == self._loop_thread:
            self._wakeup.set()
        else:
            self._loop.call_soon_threadsafe(self._wakeup.set)

    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"outbox-flusher:{self.topic}")

    async def flushed(self, timeout_s: float | None = None) -> None:
        """Wait until the outbox is empty (every row acknowledged)."""

        async def _empty() -> None:
            while self.outbox.depth():
                await asyncio.sleep(FLUSHED_POLL_S)

        await asyncio.wait_for(_empty(), timeout_s)

    async def stop(self) -> None:
        """Flush what is pending within the stop timeout, then stop; the rest stays in the outbox."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await self.flushed(self._config.stop_timeout_s)
        self._stopping = True
        self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and self._task.exception() is not None:
            log.error("outbox flusher died: %r", self._task.exception())
        self._task = None
        self._loop = None
        await self._drop_producer()

    async def _run(self) -> None:
        backoff = self._config.backoff_s
        while not self._stopping:
            self._wakeup.clear()  # before reading, so a row appended meanwhile wakes us again
            rows = self._sendable(self.outbox.pending(self._config.batch_size))
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self._config.poll_interval_s)
                continue
            try:
                await asyncio.wait_for(self._send(rows), self._config.send_timeout_s)
                backoff = self._config.backoff_s
            except Exception as exc:  # broker down, timeouts: keep the rows, retry later
                self.counters.send_errors += 1
                log.warning("outbox: %d rows not sent (%r); retrying in %.1f s", len(rows), exc, backoff)
                await self._drop_producer()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._config.backoff_max_s)

    def _sendable(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """This round's rows: a suspect (refused as too large in a shared round) goes alone, the rows
        before the first suspect together."""
        for index, row in enumerate(rows):
            if row.id in self._suspects:
                return rows[index : index + 1] if index == 0 else rows[:index]
        return rows

    async def _send(self, rows: list[OutboxRow]) -> None:
        producer = await self._connected()
        acked: list[int] = []

        def on_done(future: asyncio.Future[object], row_id: int) -> None:
            if not future.cancelled() and future.exception() is None:
                acked.append(row_id)

        try:
            sent: list[tuple[OutboxRow, asyncio.Future[object]]] = []
            for row in rows:
                if row.headers is None and self._upgrade is not None:
                    row = self._upgrade(row)
                headers = list(row.headers or ())
                try:
                    future = await producer.send(self.topic, row.value, key=row.key, headers=headers or None)
                except SIZE_ERRORS as exc:  # over the producer's max_request_size: never sendable
                    self._set_aside(row, exc)
                    continue
                future.add_done_callback(lambda f, row_id=row.id: on_done(f, row_id))
                sent.append((row, future))
            results = await asyncio.gather(*(future for _, future in sent), return_exceptions=True)
        finally:
            self.outbox.remove(acked)  # whatever the broker acknowledged, even if the round fails
            self.counters.sent += len(acked)
        errors: list[BaseException] = []
        for (row, _), result in zip(sent, results, strict=True):
            if isinstance(result, SIZE_ERRORS) and len(sent) == 1:
                self._set_aside(row, result)  # refused by the broker although sent alone
            elif isinstance(result, SIZE_ERRORS):
                self._suspects.add(row.id)  # the broker refused its batch: the next rounds send it alone
            elif isinstance(result, BaseException):
                errors.append(result)
        if errors:
            raise errors[0]

    def _set_aside(self, row: OutboxRow, exc: BaseException) -> None:
        self.outbox.set_aside(row.id, repr(exc))
        self._suspects.discard(row.id)
        self.counters.set_aside += 1
        log.error("outbox %s: event %d (key %r, %d bytes) set aside, the broker can never take it (%r); the "
                  "events behind it are delivered (outbox_set_aside table of %s)", self.topic, row.id, row.key,
                  len(row.value), exc, self.outbox.path)  # fmt: skip

    async def _connected(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = self._factory()
            try:
                await producer.start()
                if self._on_connect is not None:
                    await self._on_connect()
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), self._config.stop_timeout_s)
                raise
            self._producer = producer
        return self._producer

    async def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), self._config.stop_timeout_s)
