"""Streams: the kinds of event a bus carries, each with its protobuf type and its Kafka record key.

- ``GENERATIONS``: ``GenerationCompleted``, the feedback loop (generator -> draft cache, retriever),
  keyed by tenant: one tenant's answers stay in order.
- ``DOCUMENTS``: ``DocumentChanged``, document replication (any retriever replica -> every replica),
  keyed by (tenant, doc id): one document's changes stay in order, and a compacted topic keeps
  exactly the latest change of each document (its current text, or its deletion). Applying a
  change sets the document's state, so only per-document order matters, not per-tenant order.

``publish(event)`` picks the stream from the event's type (``stream_of``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from lookahead_rag.v1 import events_pb2

Event: TypeAlias = events_pb2.GenerationCompleted | events_pb2.DocumentChanged


def tenant_key(event: Any) -> bytes:
    """Kafka key of a GenerationCompleted: its tenant."""
    return str(event.tenant).encode()


def document_key(event: Any) -> bytes:
    """Kafka key of a DocumentChanged: ``["<tenant>","<doc id>"]`` (JSON: unambiguous for any names)."""
    return json.dumps([event.tenant, event.doc_id], separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Stream:
    """One kind of event: its logical name, protobuf class and Kafka record key."""

    name: str  # logical name: in-process routing, file names of its outbox
    message: type[Any]  # the protobuf class of its events
    key: Callable[[Any], bytes]  # Kafka record key of an event

    def decode(self, data: bytes | None) -> Any:
        """Parse a serialized event; raises on bytes that are not a usable event of this stream."""
        event = self.message.FromString(data or b"")
        if not event.event_id:
            raise ValueError(f"{self.message.__name__} without event_id")
        return event


GENERATIONS = Stream("generations", events_pb2.GenerationCompleted, tenant_key)
DOCUMENTS = Stream("documents", events_pb2.DocumentChanged, document_key)
STREAMS: tuple[Stream, ...] = (GENERATIONS, DOCUMENTS)
_BY_TYPE: dict[type[Any], Stream] = {s.message: s for s in STREAMS}


def stream_of(event: Any) -> Stream:
    """The stream an event belongs to, by its protobuf type."""
    try:
        return _BY_TYPE[type(event)]
    except KeyError:
        raise TypeError(f"no stream carries {type(event).__name__} events") from None
