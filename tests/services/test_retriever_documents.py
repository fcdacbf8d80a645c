"""Applying document changes: the pure plan, the DocumentsApplier over real tenant indexes (a tiny
hash embedder, no model), its fingerprint snapshot, and the Kafka key of a document's events."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from lookahead_rag.services.events.protocols import StaleSnapshot
from lookahead_rag.services.events.streams import DOCUMENTS, document_key, stream_of
from lookahead_rag.services.retriever.core import IngestResult
from lookahead_rag.services.retriever.doc_applier import DocumentsApplier
from lookahead_rag.services.retriever.doc_events import change_event, delete_change, plan_changes, upsert_change
from lookahead_rag.services.retriever.doc_writer import DocumentWriter
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.store import IndexStore
from lookahead_rag.services.retriever.tenants import TenantIndexes
from lookahead_rag.v1 import events_pb2
from tests.services.retriever_helpers import settings

TENANT = "acme"
DIM = 8


class HashEncoder:
    """Unit vectors drawn from a hash of the text: same text, same vector; no model."""

    dim = DIM

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
            row = np.random.default_rng(seed).standard_normal(DIM)
            rows.append(row / np.linalg.norm(row))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), DIM)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])


def doc(doc_id: str, text: str) -> Document:
    return Document(id=doc_id, title=doc_id, text=text)


def upsert(doc_id: str, text: str, tenant: str = TENANT) -> events_pb2.DocumentChanged:
    return change_event(tenant, upsert_change(doc(doc_id, text)))


def delete(doc_id: str, tenant: str = TENANT) -> events_pb2.DocumentChanged:
    return change_event(tenant, delete_change(doc_id))


def make_indexes(data_dir: Path | None = None) -> TenantIndexes:
    return TenantIndexes(settings(data_dir), HashEncoder(), IndexStore(data_dir))


def texts(indexes: TenantIndexes, tenant: str = TENANT) -> list[str]:
    index = indexes.indexes.get(tenant)
    return sorted(chunk.text for chunk in index.chunks) if index is not None else []


# ---- the pure plan ----------------------------------------------------------------------------------


def test_plan_skips_what_is_already_in_its_state_and_replaces_the_rest() -> None:
    held = {"a": doc("a", "alpha").digest(), "b": doc("b", "beta").digest()}
    changes = [upsert_change(doc("a", "alpha")), upsert_change(doc("b", "beta v2")), upsert_change(doc("c", "new")),
               delete_change("gone"), delete_change("a")]  # fmt: skip
    plan = plan_changes(held, changes)
    # "a" was upserted unchanged then deleted: its last change wins, so it is removed, not skipped
    assert [c.doc_id for c in plan.upserts] == ["b", "c"]
    assert sorted(plan.removes) == ["a", "b"]  # b's old version goes before its new one comes
    assert plan.deleted == 1
    assert plan.unchanged == 1  # the delete of "gone", which the tenant never held


# ---- the applier ------------------------------------------------------------------------------------


def test_the_same_event_twice_changes_nothing_the_second_time() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    event = upsert("json", "Serialize obj to a JSON str.")
    assert applier.apply(event) is True
    changes = indexes.indexes[TENANT].changes
    # a resend (lost acknowledgement) or a replay after a restart: same (tenant, doc, version)
    assert applier.apply(event) is False
    assert indexes.indexes[TENANT].changes == changes
    assert texts(indexes) == ["Serialize obj to a JSON str."]


def test_another_event_with_the_version_already_held_changes_nothing() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    applier.apply(upsert("json", "Serialize obj to a JSON str."))
    # the same content ingested again through another replica: a new event id, the same version
    again = upsert("json", "Serialize obj to a JSON str.")
    assert applier.apply(again) is False
    assert len(indexes.indexes[TENANT]) == 1


def test_a_new_version_replaces_the_old_chunks() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    applier.apply(upsert("json", "old text"))
    applier.apply(upsert("csv", "csv text"))
    # the new version's chunks replace the old ones; the other document is untouched
    assert applier.apply(upsert("json", "new text")) is True
    assert texts(indexes) == ["csv text", "new text"]
    assert indexes.versions(TENANT)["json"] == doc("json", "new text").digest()


def test_a_delete_removes_the_document_and_its_chunks() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    applier.apply(upsert("json", "json text"))
    applier.apply(upsert("csv", "csv text"))
    # the chunks leave the FAISS index too: a search can no longer find them
    assert applier.apply(delete("json")) is True
    assert texts(indexes) == ["csv text"]
    hits = indexes.indexes[TENANT].search(HashEncoder().encode_one("json\njson text"), 5)
    assert [hit.chunk.doc_id for hit in hits] == ["csv"]


def test_a_delete_of_an_absent_document_is_a_no_op() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    # an unknown tenant stays unknown: no empty index is created for it
    assert applier.apply(delete("never", tenant="globex")) is False
    assert "globex" not in indexes.indexes
    applier.apply(upsert("json", "json text"))
    # a known tenant, an unknown document: nothing changes
    changes = indexes.indexes[TENANT].changes
    assert applier.apply(delete("never")) is False
    assert indexes.indexes[TENANT].changes == changes


def test_changes_apply_in_the_order_they_come() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    v1, v2 = upsert("json", "version one"), upsert("json", "version two")
    applier.apply(v2)
    # Not expected within a partition (one document's events share a key, so the log keeps their
    # order); if it happened the older version would win: versions are hashes, the log's order is the truth.
    assert applier.apply(v1) is True
    assert texts(indexes) == ["version one"]


def test_an_unusable_event_raises_and_changes_nothing() -> None:
    indexes = make_indexes()
    applier = DocumentsApplier(indexes)
    broken = upsert("json", "text")
    broken.text = ""
    # raised before any change: the bus retries it, then dead-letters it
    with pytest.raises(ValueError, match="needs a version and a text"):
        applier.apply(broken)
    assert indexes.indexes == {}


# ---- snapshot = fingerprint of the persisted indexes -------------------------------------------------


def test_the_snapshot_matches_the_indexes_written_to_disk(tmp_path: Path) -> None:
    indexes = make_indexes(tmp_path)
    applier = DocumentsApplier(indexes)
    applier.apply(upsert("json", "json text"))
    assert list((tmp_path / "indexes").glob("*.npz")) == []  # replicated changes are written later
    assert indexes.save_changed() == 1
    snapshot = applier.snapshot()
    # a restart: the indexes loaded from disk are the ones the snapshot describes, so the consumer resumes
    DocumentsApplier(make_indexes(tmp_path)).restore(snapshot)


def test_a_snapshot_that_does_not_match_the_disk_is_stale(tmp_path: Path) -> None:
    indexes = make_indexes(tmp_path)
    applier = DocumentsApplier(indexes)
    applier.apply(upsert("json", "json text"))
    snapshot = applier.snapshot()  # taken before the index reached the disk (then the process crashed)
    # the consumer must read the log again from the beginning rather than resume after this event
    with pytest.raises(StaleSnapshot, match="1 tenant"):
        DocumentsApplier(make_indexes(tmp_path)).restore(snapshot)
    # an in-memory retriever (no data dir) never matches a snapshot that holds documents either
    with pytest.raises(StaleSnapshot):
        DocumentsApplier(make_indexes()).restore(snapshot)
    # nor do bytes that are not a documents snapshot
    with pytest.raises(StaleSnapshot):
        DocumentsApplier(make_indexes()).restore(b"\x00 not json")


# ---- the Kafka key -------------------------------------------------------------------------------------


def test_a_documents_events_share_one_key_and_other_documents_do_not() -> None:
    # one key per (tenant, doc): its changes stay in order and compaction keeps its latest state
    assert document_key(upsert("json", "a")) == document_key(delete("json"))
    assert document_key(upsert("json", "a")) != document_key(upsert("csv", "a"))
    # unambiguous whatever the names contain: ("a/b", "c") and ("a", "b/c") differ
    assert document_key(upsert("c", "t", tenant="a/b")) != document_key(upsert("b/c", "t", tenant="a"))
    assert stream_of(delete("json")) is DOCUMENTS


# ---- the writer's reply when its own replica's consumer is quick ---------------------------------
RACE_S = 0.5  # how long the eager consumer gets before the writer goes on


class WriterCore:
    """What DocumentWriter needs of RetrieverCore, over real tenant indexes."""

    def __init__(self, indexes: TenantIndexes) -> None:
        self.documents = indexes

    def check_ingest(self, tenant: str, documents: Sequence[Document]) -> None:
        pass

    def ingest(self, tenant: str, documents: Sequence[Document]) -> IngestResult:
        done = self.documents.apply(tenant, [upsert_change(d) for d in documents], persist=False)
        return IngestResult(done.upserted, done.unchanged, done.chunks, done.total_chunks)


class EagerConsumer:
    """A publisher whose consumer (another thread) applies each event at once, before the writer can."""

    def __init__(self, applier: DocumentsApplier) -> None:
        self.applier = applier
        self.threads: list[threading.Thread] = []

    def publish(self, event: events_pb2.DocumentChanged) -> None:
        thread = threading.Thread(target=self.applier.apply, args=(event,))
        thread.start()
        thread.join(RACE_S)  # without the writer's lock the consumer has applied by now
        self.threads.append(thread)


def test_ingest_reply_counts_the_change_even_when_its_own_consumer_applies_first() -> None:
    # the pipeline test saw documents == 0 for a new document: the in-process consumer had won the race
    indexes = make_indexes()
    bus = EagerConsumer(DocumentsApplier(indexes))
    result = DocumentWriter(WriterCore(indexes), bus).ingest(TENANT, [doc("d1", "Some text about quotas.")])
    for thread in bus.threads:
        thread.join()
    assert (result.documents, result.unchanged) == (1, 0)
    assert result.chunks > 0 and result.total_chunks == result.chunks
    assert texts(indexes) == ["Some text about quotas."]  # the consumer's late apply changed nothing
