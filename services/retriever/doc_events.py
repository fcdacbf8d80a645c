"""Document changes: the ``DocumentChanged`` event to and from a ``Change``, and what a change does.

Pure functions, no index and no I/O; ``tenants.TenantIndexes.apply`` carries out a ``Plan``.

A change *sets* one document's state: present at ``version`` (its content hash) with that content,
or absent. So applying is idempotent by (tenant, doc_id, version): the same change again, an upsert
of the version the tenant already holds, or a delete of a document it does not hold changes
nothing. Changes apply in the order they come: one document's changes share a Kafka key, so the
log keeps them in order, and the last one in the log is the document's state on every replica. An
older version arriving after a newer one is applied as it comes (versions are hashes, not
counters: the log's order is the truth).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.v1 import events_pb2

MS_PER_S = 1000


@dataclass(frozen=True, slots=True)
class Change:
    """One document's new state in a tenant: ``document`` at ``version``, or deleted (None)."""

    doc_id: str
    version: str  # content hash (Document.digest); "" when deleted
    document: Document | None  # the new content; None = delete


@dataclass(frozen=True, slots=True)
class Plan:
    """What applying some changes to a tenant does (documents already in that state are left alone)."""

    upserts: list[Change]  # documents to index: new, or held at another version
    removes: list[str]  # held documents whose chunks go: replaced by an upsert, or deleted
    deleted: int  # held documents deleted
    unchanged: int  # documents whose change changes nothing (same version, or delete of an absent one)

    @property
    def changed(self) -> bool:
        return bool(self.upserts or self.removes)


def upsert_change(doc: Document) -> Change:
    return Change(doc.id, doc.digest(), doc)


def delete_change(doc_id: str) -> Change:
    return Change(doc_id, "", None)


def plan_changes(held: Mapping[str, str], changes: Sequence[Change]) -> Plan:
    """The effect of ``changes``, in order, on a tenant holding ``held`` (doc id -> version).

    A document changed twice ends in its last change's state.
    """
    final: dict[str, Change] = {}
    for change in changes:
        final[change.doc_id] = change
    upserts: list[Change] = []
    removes: list[str] = []
    deleted = unchanged = 0
    for doc_id, change in final.items():
        version = held.get(doc_id)
        if change.document is None:
            if version is None:
                unchanged += 1
                continue
            removes.append(doc_id)
            deleted += 1
        elif version == change.version:
            unchanged += 1
        else:
            upserts.append(change)
            if version is not None:
                removes.append(doc_id)
    return Plan(upserts, removes, deleted, unchanged)


def _now_ms() -> int:
    return int(time.time() * MS_PER_S)


def change_event(tenant: str, change: Change, request_id: str = "") -> events_pb2.DocumentChanged:
    """The event announcing ``change`` to every replica (a fresh event id, created now)."""
    doc = change.document
    return events_pb2.DocumentChanged(
        event_id=uuid.uuid4().hex,
        tenant=tenant,
        doc_id=change.doc_id,
        version=change.version,
        deleted=doc is None,
        title=doc.title if doc is not None else "",
        text=doc.text if doc is not None else "",
        source=doc.source if doc is not None else "",
        created_unix_ms=_now_ms(),
        request_id=request_id,
    )


def change_of(event: events_pb2.DocumentChanged) -> Change:
    """The change an event carries; raises ValueError on one no replica could apply."""
    if not event.tenant or not event.doc_id:
        raise ValueError(f"DocumentChanged {event.event_id}: empty tenant or doc_id")
    if event.deleted:
        return delete_change(event.doc_id)
    if not event.version or not event.text.strip():
        raise ValueError(f"DocumentChanged {event.event_id}: an upsert needs a version and a text")
    doc = Document(id=event.doc_id, title=event.title, text=event.text, source=event.source)
    return Change(event.doc_id, event.version, doc)
