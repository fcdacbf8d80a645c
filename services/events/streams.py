"""Streams: the kinds of event a bus carries, each with its protobuf type and its Kafka record key.

- ``GENERATIONS``: ``GenerationCompleted``, the feedback loop (generator -> draft cache, retriever),
  and ``ForgetRequested`` (retriever's Forget -> draft cache, retriever, generator), keyed by tenant:
  one tenant's answers and forgets stay in order with each other.
- ``DOCUMENTS``: ``DocumentChanged``, document replication (any retriever replica -> every replica),
  keyed by (tenant, doc id): one document's changes stay in order, and a compacted topic keeps
  exactly the latest change of each document (its current text, or its deletion). Applying a
  change sets the document's state, so only per-document order matters, not per-tenant order.

``publish(event)`` picks the stream from the event's type (``stream_of``).

Kafka records (``events.records``): every value is its message's bare protobuf, its type in a
``ce_type`` header. ``Stream.encode``/``parse`` are the value format from before headers, still read
(a record without ``ce_type``) and written with ``KafkaSettings.record_format = "framed"``: a stream's
first message type (``message``) is its bare protobuf; every other type a stream carries (``others``)
is framed: ``FRAME_MARK`` (0x00: a protobuf tag of field number 0 is illegal, so no bare message starts
with it), one byte of name length, the message's full name, then its protobuf. A consumer that
predates a framed type cannot parse it and dead-letters it rather than misreading it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from lookahead_rag.v1 import events_pb2

Event: TypeAlias = events_pb2.GenerationCompleted | events_pb2.ForgetRequested | events_pb2.DocumentChanged

FRAME_MARK = b"\x00"  # first byte of a framed record value (never the first byte of a bare protobuf)
MAX_FRAME_NAME = 255  # a framed type's full name is at most this many bytes (one length byte)


def tenant_key(event: Any) -> bytes:
    """Kafka key of a GenerationCompleted or a ForgetRequested: its tenant."""
    return str(event.tenant).encode()


def document_key(event: Any) -> bytes:
    """Kafka key of a DocumentChanged: ``["<tenant>","<doc id>"]`` (JSON: unambiguous for any names)."""
    return json.dumps([event.tenant, event.doc_id], separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Stream:
    """One kind of event: its logical name, protobuf classes and Kafka record key."""

    name: str  # logical name: in-process routing, file names of its outbox
    message: type[Any]  # the protobuf class of its events (records of it are bare protobuf)
    key: Callable[[Any], bytes]  # Kafka record key of an event
    others: tuple[type[Any], ...] = ()  # further protobuf classes it carries (records of them are framed)

    @property
    def messages(self) -> tuple[type[Any], ...]:
        return (self.message, *self.others)

    def message_named(self, full_name: str) -> type[Any] | None:
        """The protobuf class of this stream whose full name is ``full_name`` (None: not carried here)."""
        for message in self.messages:
            if message.DESCRIPTOR.full_name == full_name:
                return message
        return None

    def encode(self, event: Any) -> bytes:
        """The pre-header record value of an event of this stream (see the module's doc for the framing)."""
        if type(event) is self.message:
            return bytes(event.SerializeToString())
        if type(event) not in self.others:
            raise TypeError(f"stream {self.name!r} does not carry {type(event).__name__} events")
        name = event.DESCRIPTOR.full_name.encode()
        if len(name) > MAX_FRAME_NAME:
            raise ValueError(f"message name {event.DESCRIPTOR.full_name!r} is too long to frame")
        return FRAME_MARK + bytes([len(name)]) + name + event.SerializeToString()

    def parse(self, data: bytes | None) -> Any:
        """A pre-header record value back into its event (no checks beyond parsing; raises on bytes it
        cannot parse)."""
        data = data or b""
        if not data.startswith(FRAME_MARK):
            return self.message.FromString(data)
        if len(data) < len(FRAME_MARK) + 1:
            raise ValueError(f"stream {self.name!r}: truncated frame")
        size = data[len(FRAME_MARK)]
        start = len(FRAME_MARK) + 1
        name = data[start : start + size].decode(errors="replace")
        message = self.message_named(name)
        if message is not None and message is not self.message:
            return message.FromString(data[start + size :])
        raise ValueError(f"stream {self.name!r} does not carry {name!r} events")

    def decode(self, data: bytes | None) -> Any:
        """Parse a pre-header value; raises on bytes that are not a usable event of this stream."""
        event = self.parse(data)
        if not event.event_id:
            raise ValueError(f"{type(event).__name__} without event_id")
        return event


GENERATIONS = Stream("generations", events_pb2.GenerationCompleted, tenant_key, (events_pb2.ForgetRequested,))
DOCUMENTS = Stream("documents", events_pb2.DocumentChanged, document_key)
STREAMS: tuple[Stream, ...] = (GENERATIONS, DOCUMENTS)
_BY_TYPE: dict[type[Any], Stream] = {message: s for s in STREAMS for message in s.messages}


def stream_of(event: Any) -> Stream:
    """The stream an event belongs to, by its protobuf type."""
    try:
        return _BY_TYPE[type(event)]
    except KeyError:
        raise TypeError(f"no stream carries {type(event).__name__} events") from None


def encode_event(event: Any) -> bytes:
    """The pre-header record value of an event on its stream (``stream_of(event).encode``)."""
    return stream_of(event).encode(event)
