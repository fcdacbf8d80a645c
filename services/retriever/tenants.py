"""Every tenant's document index, and the one way documents enter or leave it: ``apply``.

Ingest, Delete and replicated ``DocumentChanged`` events all go through ``apply(tenant, changes)``:
it plans with ``doc_events.plan_changes`` (idempotent by (tenant, doc id, version)), chunks and
embeds the new documents outside the search lock, then swaps the chunks in under it.

Persistence: ``apply(persist=True)`` writes the tenant's file before it returns (Ingest, Delete);
replicated changes are written by ``save_changed`` (a periodic job, and on close), since a bulk
ingest elsewhere would otherwise rewrite the whole file once per document. A tenant's file never
goes backwards: each write carries the index's change count and an older one is skipped.
``fingerprint()`` says which documents, at which versions, each tenant holds (the replicated
consumer's snapshot compares it with what it finds on disk at start).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from lookahead_rag.services.retriever.doc_events import Change, plan_changes
from lookahead_rag.services.retriever.documents import make_chunks
from lookahead_rag.services.retriever.embeddings import Encoder
from lookahead_rag.services.retriever.index import IndexConfig, TenantIndex
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.services.retriever.store import IndexStore

NEVER_SAVED = -1  # change count of a tenant index with no file written by this process


@dataclass(frozen=True, slots=True)
class ApplyResult:
    upserted: int  # documents indexed: new, or replacing another version
    deleted: int  # documents removed
    unchanged: int  # changes that changed nothing
    chunks: int  # chunks added
    total_chunks: int  # the tenant's index size afterwards

    @property
    def changed(self) -> bool:
        return bool(self.upserted or self.deleted)


class TenantIndexes:
    """Tenant -> TenantIndex, loaded from ``store``; thread-safe (``lock`` guards every index)."""

    def __init__(self, settings: RetrieverSettings, embedder: Encoder, store: IndexStore) -> None:
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self.config = IndexConfig.from_settings(settings)
        self.indexes: dict[str, TenantIndex] = store.load_indexes(self.config, embedder.dim)
        self.lock = threading.RLock()  # guards ``indexes`` and every TenantIndex in it (searches hold it)
        # one apply at a time (searches go on meanwhile); re-entrant: a writer holds it across publish + apply
        self._apply_lock = threading.RLock()
        self._save_lock = threading.Lock()  # one file write at a time
        self._saved: dict[str, int] = {t: index.changes for t, index in self.indexes.items()}

    def exclusive(self) -> AbstractContextManager[bool]:
        """Hold it to apply before any other apply runs (DocumentWriter: publish, then apply locally, with
        this replica's own consumer of the published events waiting until then)."""
        return self._apply_lock

    def versions(self, tenant: str) -> dict[str, str]:
        """The tenant's documents: doc id -> version (content hash)."""
        with self.lock:
            index = self.indexes.get(tenant)
            return dict(index.doc_digests) if index is not None else {}

    def _held(self, tenant: str, changes: Sequence[Change]) -> dict[str, str]:
        """The versions the tenant holds of the changed documents (not all of them: one replicated
        event at a time must not cost a copy of a large tenant's whole listing)."""
        with self.lock:
            index = self.indexes.get(tenant)
            digests = index.doc_digests if index is not None else {}
            return {c.doc_id: digests[c.doc_id] for c in changes if c.doc_id in digests}

    def apply(self, tenant: str, changes: Sequence[Change], persist: bool) -> ApplyResult:
        """Bring the tenant's documents to the state ``changes`` set, in order (see doc_events)."""
        s = self.settings
        with self._apply_lock:
            plan = plan_changes(self._held(tenant, changes), changes)
            chunks = [
                chunk
                for change in plan.upserts
                if change.document is not None
                for chunk in make_chunks(change.document, s.chunk_chars, s.chunk_overlap)
            ]
            vectors = (  # [n, dim], no lock held
                self.embedder.encode([c.embedding_text() for c in chunks])
                if chunks
                else np.zeros((0, self.embedder.dim), dtype=np.float32)
            )
            with self.lock:
                index = self.indexes.get(tenant)
                if index is None and plan.upserts:
                    index = self.indexes[tenant] = TenantIndex(tenant, self.embedder.dim, self.config)
                if index is not None and plan.removes:
                    index.remove_documents(plan.removes)
                if index is not None and plan.upserts:
                    index.add(chunks, vectors, {c.doc_id: c.version for c in plan.upserts})
                total = len(index) if index is not None else 0
            if persist and plan.changed:
                self.save(tenant)
        return ApplyResult(len(plan.upserts), plan.deleted, plan.unchanged, len(chunks), total)

    def save(self, tenant: str) -> bool:
        """Write the tenant's file if it changed since the last write; True when written."""
        if self.store.index_dir is None:
            return False
        with self.lock:
            index = self.indexes.get(tenant)
            if index is None or index.changes <= self._saved.get(tenant, NEVER_SAVED):
                return False
            changes, blob = index.changes, index.to_bytes()
        with self._save_lock:
            if changes <= self._saved.get(tenant, NEVER_SAVED):  # a newer state was written meanwhile
                return False
            self.store.save_index(index, blob)
            self._saved[tenant] = changes
        return True

    def save_changed(self) -> int:
        """Write every tenant changed since its last write; how many were written."""
        with self.lock:
            tenants = list(self.indexes)
        return sum(self.save(tenant) for tenant in tenants)

    def fingerprint(self) -> dict[str, str]:
        """Tenant -> a hash of its (doc id, version) pairs: equal fingerprints, equal documents."""
        with self.lock:
            return {tenant: index.fingerprint() for tenant, index in self.indexes.items()}
