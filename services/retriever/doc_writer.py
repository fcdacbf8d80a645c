"""``DocumentWriter``: Ingest and Delete as document events, so that every replica applies them.

    writer = DocumentWriter(core, bus)          # bus=None: this replica only (no events)
    writer.ingest("acme", docs)                 # -> IngestResult, as core.ingest
    writer.delete("acme", ["json.dumps"])       # -> DeleteResult, as core.delete

Each call validates first (InvalidArgument, nothing published), then publishes one
``DocumentChanged`` per document (the bus's publish is durable with Kafka: the outbox), then
applies the same changes here before it returns, so a Retrieve on this replica sees them at once.
Other replicas apply them from the documents topic a moment later (eventual consistency); this
replica meets them there again and skips them (same version). Publishing comes first: the log is
the truth, so a failure after it leaves this replica behind (its consumer catches up), never the
others without a change this one made. Blocking (embedding): async callers use asyncio.to_thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_rag.services.common.telemetry.logs import current_request_id
from lookahead_rag.services.events.protocols import EventPublisher
from lookahead_rag.services.retriever.core import DeleteResult, IngestResult, RetrieverCore
from lookahead_rag.services.retriever.doc_events import Change, change_event, delete_change, upsert_change
from lookahead_rag.services.retriever.documents import Document


class DocumentWriter:
    """Validate, publish, apply locally: the Ingest and Delete RPCs."""

    def __init__(self, core: RetrieverCore, publisher: EventPublisher | None = None) -> None:
        self.core = core
        self.publisher = publisher

    def ingest(self, tenant: str, documents: Sequence[Document]) -> IngestResult:
        self.core.check_ingest(tenant, documents)
        # Our own replica's consumer may get the event before we apply it: it waits for the lock, so the
        # reply counts what this request changed, not "unchanged" (it then finds nothing to do).
        with self.core.documents.exclusive():
            self._publish(tenant, [upsert_change(doc) for doc in documents])
            return self.core.ingest(tenant, documents)

    def delete(self, tenant: str, doc_ids: Sequence[str]) -> DeleteResult:
        """Every id is announced, also those this replica does not hold (another may hold it already)."""
        ids = self.core.check_delete(tenant, doc_ids)
        with self.core.documents.exclusive():
            self._publish(tenant, [delete_change(doc_id) for doc_id in ids])
            return self.core.delete(tenant, ids)

    def _publish(self, tenant: str, changes: Sequence[Change]) -> None:
        if self.publisher is None:
            return
        request_id = current_request_id() or ""
        for change in changes:
            self.publisher.publish(change_event(tenant, change, request_id))
