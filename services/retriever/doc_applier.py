"""``DocumentsApplier``: the retriever's applier of ``DocumentChanged`` events (every replica runs one).

    bus.subscribe(RETRIEVER_DOCUMENTS_GROUP, DocumentsApplier(core.documents), stream=DOCUMENTS,
                  every_replica=True)

``apply`` sets one document's state (``doc_events``): idempotent by (tenant, doc id, version), so
the event that this replica already applied while serving the Ingest, a resend, or a replay of the
log changes nothing. It does not write the tenant's file (``TenantIndexes.save_changed`` does, in
the background and on close).

Snapshot: the tenant indexes are persisted by the retriever itself, so the snapshot saved with the
consumer's offsets is only their fingerprint (tenant -> hash of its (doc id, version) pairs). At
start, ``restore`` compares it with the indexes loaded from disk: equal, the consumer resumes from
the saved offsets; different (a crash between an apply and the next snapshot, a lost or in-memory
data dir), it raises ``StaleSnapshot`` and the consumer reads the whole log again: documents already
held at their version are skipped, the rest are indexed.
"""

from __future__ import annotations

import json

from lookahead_rag.services.events.protocols import StaleSnapshot
from lookahead_rag.services.retriever.doc_events import change_of
from lookahead_rag.services.retriever.tenants import TenantIndexes
from lookahead_rag.v1 import events_pb2

SNAPSHOT_FORMAT = 1


class DocumentsApplier:
    """EventApplier of DocumentChanged over a retriever's ``TenantIndexes``. Thread-safe."""

    def __init__(self, indexes: TenantIndexes) -> None:
        self.indexes = indexes

    def apply(self, event: events_pb2.DocumentChanged) -> bool:
        """Bring the event's document to the state it sets; False when it was already in it."""
        return self.indexes.apply(event.tenant, [change_of(event)], persist=False).changed

    def snapshot(self) -> bytes:
        """Which documents, at which versions, each tenant holds (a fingerprint, not the indexes)."""
        return json.dumps({"format": SNAPSHOT_FORMAT, "tenants": self.indexes.fingerprint()}, sort_keys=True).encode()

    def restore(self, data: bytes) -> None:
        """Check that the indexes on disk are the ones the snapshot describes; StaleSnapshot if not."""
        try:
            saved = json.loads(data)
            tenants = saved["tenants"] if saved.get("format") == SNAPSHOT_FORMAT else None
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise StaleSnapshot(f"unreadable documents snapshot ({exc!r})") from exc
        if not isinstance(tenants, dict):
            raise StaleSnapshot(f"documents snapshot format {saved.get('format')!r} is not {SNAPSHOT_FORMAT}")
        held = self.indexes.fingerprint()
        if tenants != held:
            differ = sorted(set(tenants) ^ set(held) | {t for t in tenants if tenants[t] != held.get(t)})
            raise StaleSnapshot(f"documents on disk differ from the snapshot in {len(differ)} tenant(s)")
