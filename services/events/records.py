"""The Kafka record format of an event: a bare protobuf value, its type in CloudEvents headers.

Every record's value is the bare protobuf of its message; its type travels in the record's headers,
in the CloudEvents Kafka protocol binding's *binary content mode* (CloudEvents 1.0):

- ``ce_specversion`` = ``1.0``, ``ce_type`` = the protobuf full name (``lookahead_rag.v1.ForgetRequested``),
  ``ce_id`` = the event id, ``ce_source`` = ``lookahead-rag/<stream>``, ``ce_time`` (RFC 3339, when the
  event has a creation time), ``content-type`` = ``application/protobuf``;
- W3C trace context (``traceparent``, ``tracestate``, ``baggage``) when published inside an active span
  (``events.trace_context``).

Why CloudEvents rather than one ad-hoc header: it is the one standard for event metadata in Kafka headers,
so Kafka Connect converters, Knative's KafkaSource and schema-aware tools that know it read the type
without our code, and ``ce_id`` lets a tool deduplicate or look an event up without parsing the value.
Why not Confluent's wire format (0x00 + schema id): it needs a schema registry at every producer; a
bare value reads as itself with any protobuf tool given the type from the header.

Records written before this format have no ``ce_type`` header: they are read the old way
(``Stream.parse``: bare = the stream's first type, a leading 0x00 frame = the named type). The setting
``KafkaSettings.record_format = "framed"`` still writes that old value (without ``ce_type``) for a
rolling upgrade whose consumers predate headers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from lookahead_rag.services.events.streams import Stream, stream_of

Headers: TypeAlias = tuple[tuple[str, bytes], ...]  # Kafka record headers, in order (names may repeat)

SPECVERSION_HEADER = "ce_specversion"  # CloudEvents version of the headers
SPECVERSION = b"1.0"  # the CloudEvents version these headers follow
TYPE_HEADER = "ce_type"  # the event's protobuf full name: what the value is
ID_HEADER = "ce_id"  # the event id (unique per source; consumers deduplicate on it)
SOURCE_HEADER = "ce_source"  # who produced it: SOURCE_PREFIX + the stream's name
SOURCE_PREFIX = "lookahead-rag/"  # a URI-reference (CloudEvents allows relative ones)
TIME_HEADER = "ce_time"  # when the event was created (RFC 3339, UTC), when the event says
CONTENT_TYPE_HEADER = "content-type"  # the value's media type (binary mode: the data's own)
PROTOBUF_CONTENT_TYPE = b"application/protobuf"  # the media type CloudEvents' protobuf format names
MS_PER_S = 1000


class UnknownEventType(ValueError):
    """The record's ``ce_type`` names a type its stream does not carry (a newer producer's): the consumer
    dead-letters it rather than misreading it."""


@dataclass(frozen=True)
class Record:
    """What a publisher stores and sends for one event: the Kafka record's value and headers."""

    value: bytes  # bare protobuf (or, record_format "framed", the pre-header value)
    headers: Headers = ()  # CloudEvents attributes and trace context (see the module's doc)


def header(headers: Iterable[tuple[str, bytes]] | None, name: str) -> bytes | None:
    """The last value of header ``name`` (Kafka headers may repeat; the last one wins), or None."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = bytes(value) if value is not None else b""
    return found


def _time(event: Any) -> bytes | None:
    created_ms = int(getattr(event, "created_unix_ms", 0) or 0)
    if created_ms <= 0:
        return None
    moment = dt.datetime.fromtimestamp(created_ms / MS_PER_S, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z").encode()


def cloudevent_headers(event: Any, stream: Stream) -> Headers:
    """The CloudEvents binary-mode headers of an event on ``stream``."""
    headers: list[tuple[str, bytes]] = [
        (SPECVERSION_HEADER, SPECVERSION),
        (TYPE_HEADER, event.DESCRIPTOR.full_name.encode()),
        (ID_HEADER, str(event.event_id).encode()),
        (SOURCE_HEADER, (SOURCE_PREFIX + stream.name).encode()),
        (CONTENT_TYPE_HEADER, PROTOBUF_CONTENT_TYPE),
    ]
    created = _time(event)
    if created is not None:
        headers.append((TIME_HEADER, created))
    return tuple(headers)


def encode_record(event: Any, *, framed: bool = False, context: Headers = ()) -> Record:
    """The record of an event on its stream: bare value + CloudEvents headers + ``context`` (trace
    headers); ``framed``: the pre-header value and no type header (``context`` still added)."""
    stream = stream_of(event)
    if framed:
        return Record(stream.encode(event), context)
    return Record(bytes(event.SerializeToString()), cloudevent_headers(event, stream) + context)


def parse_record(stream: Stream, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None = None) -> Any:
    """A record back into its event: by its ``ce_type`` header, or (no header: an old record) the old way.
    Raises ``UnknownEventType`` for a type ``stream`` does not carry, and on a value that does not parse."""
    named = header(headers, TYPE_HEADER)
    if named is None:
        return stream.parse(value)
    name = named.decode(errors="replace")
    message = stream.message_named(name)
    if message is None:
        raise UnknownEventType(f"stream {stream.name!r} does not carry {name!r} events")
    return message.FromString(value or b"")


def decode_record(stream: Stream, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None = None) -> Any:
    """``parse_record``, and the event must have an event id (raises otherwise)."""
    event = parse_record(stream, value, headers)
    if not event.event_id:
        raise ValueError(f"{type(event).__name__} without event_id")
    return event


def upgrade_legacy(stream: Stream, value: bytes, *, framed: bool = False) -> Record:
    """A value stored before headers existed (an outbox row of an older version) in today's format;
    a value that does not parse is kept as it is, without headers (its consumers dead-letter it)."""
    try:
        event = stream.parse(value)
    except Exception:  # the old reader could not read it either: send it unchanged
        return Record(value)
    return encode_record(event, framed=framed)
