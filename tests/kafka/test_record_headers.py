"""The record format: bare protobuf values, the event type in CloudEvents headers; old records stay readable."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord

from lookahead_rag.services.events.kafka.broker import LocalBroker, ensure_topics
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.dead_letter import REASON_DECODE, dlt_headers
from lookahead_rag.services.events.kafka.outbox import Outbox, headers_from_text, headers_to_text
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.record_handler import RecordHandler
from lookahead_rag.services.events.protocols import ConsumerCounters
from lookahead_rag.services.events.records import (
    TYPE_HEADER,
    UnknownEventType,
    decode_record,
    encode_record,
    header,
    upgrade_legacy,
)
from lookahead_rag.services.events.streams import DOCUMENTS, FRAME_MARK, GENERATIONS, Stream
from lookahead_rag.v1 import events_pb2
from tests.builders import completed
from tests.kafka.helpers import RecordingApplier, fast_settings, new_topic, read_topic, run, wait_until

pytestmark = pytest.mark.timeout(120)

CREATED_MS = 1_700_000_000_123  # a creation time with milliseconds
UNKNOWN_TYPE = b"lookahead_rag.v9.SomethingNewer"  # a type a newer producer might send
OLD_SCHEMA = """CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB, value BLOB NOT NULL,
created_ms INTEGER NOT NULL)"""  # the outbox table before record headers


def forget(tenant: str = "acme") -> events_pb2.ForgetRequested:
    return events_pb2.ForgetRequested(event_id=uuid.uuid4().hex, tenant=tenant, doc_id="d1", created_unix_ms=CREATED_MS)


def document(tenant: str = "acme") -> events_pb2.DocumentChanged:
    return events_pb2.DocumentChanged(event_id=uuid.uuid4().hex, tenant=tenant, doc_id="d1", version="v1", text="t")


EVENTS = [
    pytest.param(lambda: completed("acme", question="q", created_unix_ms=CREATED_MS), GENERATIONS, id="completed"),
    pytest.param(forget, GENERATIONS, id="forget"),
    pytest.param(document, DOCUMENTS, id="document"),
]


def consumer_record(value: bytes | None, headers: tuple[tuple[str, bytes], ...] = (), topic: str = "t") -> Any:
    return ConsumerRecord(topic, 0, 7, 0, 0, b"acme", value, None, 0, len(value or b""), headers)


class FakeDeadLetters:
    """Takes what a DeadLetterSender would send, with its headers."""

    def __init__(self) -> None:
        self.group = "g"
        self.sent: list[tuple[Any, str, list[tuple[str, bytes]]]] = []

    async def send(self, record: Any, reason: str, exc: BaseException, attempts: int) -> None:
        self.sent.append((record, reason, dlt_headers(record, self.group, reason, exc, attempts)))


# ---- encode / decode -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("make", "stream"), EVENTS)
def test_every_type_round_trips_as_bare_protobuf_named_by_its_header(make: Any, stream: Stream) -> None:
    event = make()
    record = encode_record(event)
    # the value is the message's bare protobuf: no 0x00 frame, readable by any protobuf tool
    assert record.value == event.SerializeToString()
    assert not record.value.startswith(FRAME_MARK)
    # the header names the type; the CloudEvents attributes are there
    assert header(record.headers, TYPE_HEADER) == event.DESCRIPTOR.full_name.encode()
    assert header(record.headers, "ce_id") == event.event_id.encode()
    assert header(record.headers, "ce_specversion") == b"1.0"
    assert header(record.headers, "ce_source") == f"lookahead-rag/{stream.name}".encode()
    assert header(record.headers, "content-type") == b"application/protobuf"
    # it comes back as itself, of its own type
    back = decode_record(stream, record.value, record.headers)
    assert type(back) is type(event) and back == event


def test_ce_time_is_the_events_creation_time_in_rfc3339() -> None:
    # created_unix_ms becomes ce_time; an event without one has no ce_time
    assert header(encode_record(forget()).headers, "ce_time") == b"2023-11-14T22:13:20.123Z"
    assert header(encode_record(document()).headers, "ce_time") is None


def test_a_forget_is_not_misread_as_an_answer_under_its_header() -> None:
    event = forget()
    record = encode_record(event)
    # its bare value would parse as a GenerationCompleted: the header is what decides
    back = decode_record(GENERATIONS, record.value, record.headers)
    assert isinstance(back, events_pb2.ForgetRequested)


@pytest.mark.parametrize(("make", "stream"), EVENTS)
def test_old_records_without_a_type_header_are_still_read(make: Any, stream: Stream) -> None:
    event = make()
    old_value = stream.encode(event)  # the pre-header value: bare for a stream's first type, else framed
    # an old record (no headers at all) reads as before, bare or framed
    assert decode_record(stream, old_value, ()) == event
    assert decode_record(stream, old_value, None) == event
    # a record carrying only trace headers (record_format "framed") reads the same way
    assert decode_record(stream, old_value, (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)) == event


def test_an_old_framed_forget_starts_with_the_frame_mark() -> None:
    # the fixture above really exercises the framed path (not only bare values)
    assert GENERATIONS.encode(forget()).startswith(FRAME_MARK)


def test_framed_format_writes_the_old_value_and_no_type_header() -> None:
    event = forget()
    record = encode_record(event, framed=True, context=(("traceparent", b"x"),))
    assert record.value == GENERATIONS.encode(event)
    assert header(record.headers, TYPE_HEADER) is None
    assert record.headers == (("traceparent", b"x"),)  # the trace context still rides along


@pytest.mark.parametrize("record_format", ["headers", "framed"])
def test_the_publisher_stores_the_configured_format(record_format: str, tmp_path: Path) -> None:
    event = forget()
    settings = fast_settings("127.0.0.1:1", new_topic(), record_format=record_format)  # never started
    publisher = KafkaPublisher(settings, tmp_path / "outbox.sqlite3")
    publisher.publish(event)
    [row] = publisher.outbox.pending(10)
    publisher.outbox.close()
    framed = record_format == "framed"
    # "framed" (a rolling upgrade): the old value, no type header; "headers": bare value, typed by ce_type
    assert row.value.startswith(FRAME_MARK) is framed
    assert (header(row.headers, TYPE_HEADER) is None) is framed
    assert decode_record(GENERATIONS, row.value, row.headers) == event


def test_a_header_naming_an_unknown_type_raises_instead_of_misreading() -> None:
    value = completed().SerializeToString()
    # a type no stream carries, and a type of another stream
    with pytest.raises(UnknownEventType, match="SomethingNewer"):
        decode_record(GENERATIONS, value, ((TYPE_HEADER, UNKNOWN_TYPE),))
    with pytest.raises(UnknownEventType, match="DocumentChanged"):
        decode_record(GENERATIONS, value, ((TYPE_HEADER, b"lookahead_rag.v1.DocumentChanged"),))


def test_a_framed_value_under_a_type_header_is_refused() -> None:
    event = forget()
    # a value with a 0x00 frame is not a bare protobuf: it must not be parsed as one
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError
        decode_record(GENERATIONS, GENERATIONS.encode(event), ((TYPE_HEADER, b"lookahead_rag.v1.ForgetRequested"),))


def test_a_record_without_event_id_is_refused() -> None:
    record = encode_record(events_pb2.ForgetRequested(tenant="acme"))
    with pytest.raises(ValueError, match="without event_id"):
        decode_record(GENERATIONS, record.value, record.headers)


# ---- the consumer's handler and the dead letters ------------------------------------------------------
def test_an_unknown_type_is_dead_lettered_with_its_headers_and_not_applied() -> None:
    applier, dead = RecordingApplier(), FakeDeadLetters()
    counters = ConsumerCounters()
    handler = RecordHandler(applier, dead, counters, max_attempts=3, retry_backoff_s=0.0)  # type: ignore[arg-type]
    original = ((TYPE_HEADER, UNKNOWN_TYPE), ("traceparent", b"tp"))
    run(handler.handle(consumer_record(completed().SerializeToString(), original)))
    assert applier.calls == 0  # not misread as an answer
    assert counters.dead_lettered == 1 and counters.applied == 0
    [(_, reason, headers)] = dead.sent
    assert reason == REASON_DECODE
    # the dead letter keeps the original headers, then says why
    assert headers[: len(original)] == list(original)
    assert dict(headers)["dlt.reason"] == b"decode"


def test_dead_letter_headers_do_not_pile_up_on_a_replayed_dead_letter() -> None:
    replayed = consumer_record(b"x", ((TYPE_HEADER, b"a.B"), ("dlt.reason", b"apply"), ("dlt.offset", b"3")))
    headers = dlt_headers(replayed, "g", REASON_DECODE, ValueError("bad"), 1)
    assert [name for name, _ in headers].count("dlt.reason") == 1
    assert headers[0] == (TYPE_HEADER, b"a.B")


def test_the_handler_applies_old_and_new_records_alike() -> None:
    applier, dead = RecordingApplier(), FakeDeadLetters()
    counters = ConsumerCounters()
    handler = RecordHandler(applier, dead, counters, max_attempts=1, retry_backoff_s=0.0)  # type: ignore[arg-type]
    old, new = completed(question="old"), completed(question="new")
    run(handler.handle(consumer_record(old.SerializeToString())))  # written before headers
    record = encode_record(new)
    run(handler.handle(consumer_record(record.value, record.headers)))
    assert applier.questions() == {"old", "new"} and not dead.sent


# ---- the outbox ---------------------------------------------------------------------------------------
def test_stored_headers_round_trip_any_bytes() -> None:
    headers = (("ce_type", b"a.B"), ("bin", bytes(range(256))), ("ce_type", b"again"))
    assert headers_from_text(headers_to_text(headers)) == headers
    assert headers_from_text(None) is None  # an old row


def test_an_old_outbox_file_gains_the_headers_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    answer, old_forget = completed(), forget()
    db = sqlite3.connect(path)
    db.execute(OLD_SCHEMA)
    for value in (answer.SerializeToString(), GENERATIONS.encode(old_forget)):
        db.execute("INSERT INTO outbox (key, value, created_ms) VALUES (?, ?, 0)", (b"acme", value))
    db.commit()
    db.close()

    outbox = Outbox(path)
    outbox.append(b"new", b"acme", (("ce_type", b"x"),))
    rows = outbox.pending(10)
    outbox.close()
    # the old rows are there, marked as old (headers None); the new one has its headers
    assert [r.headers for r in rows] == [None, None, (("ce_type", b"x"),)]
    # upgraded, each old row is today's record: bare value, its type in the header
    upgraded = [upgrade_legacy(GENERATIONS, r.value) for r in rows[:2]]
    assert [u.value for u in upgraded] == [answer.SerializeToString(), old_forget.SerializeToString()]
    assert [header(u.headers, TYPE_HEADER) for u in upgraded] == [
        b"lookahead_rag.v1.GenerationCompleted", b"lookahead_rag.v1.ForgetRequested"]


def test_an_unparseable_old_row_is_sent_unchanged_without_headers() -> None:
    garbage = FRAME_MARK + b"\x05abc"  # a truncated frame: the old reader could not read it either
    assert upgrade_legacy(GENERATIONS, garbage).value == garbage
    assert upgrade_legacy(GENERATIONS, garbage).headers == ()


# ---- the real broker ----------------------------------------------------------------------------------
@pytest.mark.kafka
def test_published_events_arrive_with_their_type_header_and_are_applied(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), partitions=1)
    answer, later = completed(question="a1"), forget()
    seen: list[Any] = []

    class Recorder(RecordingApplier):
        def apply(self, event: Any) -> bool:
            seen.append(event)
            return True

    async def scenario() -> None:
        publisher = KafkaPublisher(settings, tmp_path / "outbox.sqlite3")
        await publisher.start()
        publisher.publish(answer)
        publisher.publish(later)
        await publisher.flushed(timeout_s=30)
        await publisher.stop()
        records = await read_topic(broker.bootstrap, settings.topic, 2)
        # on the wire: bare values, each record's header names its type
        assert [r.value for r in records] == [answer.SerializeToString(), later.SerializeToString()]
        assert [header(r.headers, TYPE_HEADER) for r in records] == [
            b"lookahead_rag.v1.GenerationCompleted", b"lookahead_rag.v1.ForgetRequested"]
        runner = KafkaConsumerRunner(broker.bootstrap, settings.topic, "g", Recorder(), tmp_path / "s",
                                     settings=settings)
        await runner.start()
        try:
            await wait_until(lambda: len(seen) == 2)
        finally:
            await runner.stop()

    run(scenario())
    assert seen == [answer, later] and isinstance(seen[1], events_pb2.ForgetRequested)


@pytest.mark.kafka
def test_old_outbox_rows_publish_in_todays_format_after_an_upgrade(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), partitions=1)
    path = tmp_path / "outbox.sqlite3"
    answer, old_forget = completed(), forget()
    db = sqlite3.connect(path)  # what the previous version left unsent
    db.execute(OLD_SCHEMA)
    for value in (answer.SerializeToString(), GENERATIONS.encode(old_forget)):
        db.execute("INSERT INTO outbox (key, value, created_ms) VALUES (?, ?, 0)", (b"acme", value))
    db.commit()
    db.close()

    async def scenario() -> list[Any]:
        publisher = KafkaPublisher(settings, path)
        await publisher.start()
        await publisher.flushed(timeout_s=30)
        await publisher.stop()
        return await read_topic(broker.bootstrap, settings.topic, 2)

    records = asyncio.run(scenario())
    # both arrive bare, typed by their header, and read back as what was published
    assert not any(r.value.startswith(FRAME_MARK) for r in records)
    assert [decode_record(GENERATIONS, r.value, r.headers) for r in records] == [answer, old_forget]
    assert header(records[1].headers, TYPE_HEADER) == b"lookahead_rag.v1.ForgetRequested"


@pytest.mark.kafka
def test_an_unknown_type_on_the_topic_goes_to_the_dlt_with_its_headers(broker: LocalBroker, tmp_path: Path) -> None:
    settings = fast_settings(broker.bootstrap, new_topic(), partitions=1)
    applier = RecordingApplier()
    good = completed(question="after")

    async def scenario() -> list[Any]:
        await ensure_topics(broker.bootstrap, {settings.topic: 1, settings.dlt_topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(settings.topic, completed().SerializeToString(), key=b"acme",
                                         headers=[(TYPE_HEADER, UNKNOWN_TYPE)])
            record = encode_record(good)
            await producer.send_and_wait(settings.topic, record.value, key=b"acme", headers=list(record.headers))
        finally:
            await producer.stop()
        runner = KafkaConsumerRunner(broker.bootstrap, settings.topic, "g", applier, tmp_path / "s", settings=settings)
        await runner.start()
        try:
            await wait_until(lambda: runner.counters.applied == 1 and runner.counters.dead_lettered == 1)
        finally:
            await runner.stop()
        return await read_topic(broker.bootstrap, settings.dlt_topic, 1)

    dead = asyncio.run(scenario())
    assert applier.questions() == {"after"}  # the unknown record was not applied as an answer
    headers = dict(dead[0].headers)
    assert headers[TYPE_HEADER] == UNKNOWN_TYPE and headers["dlt.reason"] == b"decode"
