"""Past sessions: per tenant, the (question -> answer) pairs of finished generations, searchable by question.

Fed by ``GenerationCompleted`` events through the event-applier protocol the bus calls:

    apply(event) -> bool        False when event.event_id was applied before (idempotent)
    snapshot() -> bytes         the full state, applied event ids included
    restore(data) -> None       replace the state with a snapshot

Tenants never mix: each tenant has its own rows and vectors, and a search only sees its own.

An answer is stored cut where the model ran on past it (``past_answers.cut_answer``: a new
"Question:", an end-of-turn token), and marked ``supported`` when the event cites a passage for it
(``retriever/citations.py``); a prompt shows only supported answers, and only when
``[retriever] past_answers_in_prompt`` is on (the drafts get every past answer from the draft cache).

``ForgetRequested`` events (same stream, same ``apply``) drop a tenant's sessions: all of them, or
those grounded on one document (each session keeps the doc ids of its answer). The forgets applied
and their horizons (``lookahead_rag.services.events.forget.ForgetLedger``) ride in the snapshot: an answer that
began before a forget covering it is recorded as applied and never indexed.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from dataclasses import asdict, dataclass

import numpy as np

from lookahead_rag.services.events.forget import ForgetLedger, grounded_on
from lookahead_rag.services.events.tenant_ids import TenantIds
from lookahead_rag.services.retriever.embeddings import Encoder
from lookahead_rag.services.retriever.past_answers import cut_answer
from lookahead_rag.v1 import events_pb2

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 2  # 2: sessions keep their doc ids, the forget ledger is saved
READABLE_VERSIONS = (1, SNAPSHOT_VERSION)  # a version 1 snapshot loads with no doc ids and no ledger


@dataclass(frozen=True, slots=True)
class SessionRecord:
    event_id: str
    question: str
    answer: str
    created_unix_ms: int
    doc_ids: tuple[str, ...] = ()  # documents the answer was grounded on
    supported: bool = False  # its passages support it (the event's citations): only these may enter a prompt


@dataclass(frozen=True, slots=True)
class ScoredSession:
    session: SessionRecord
    score: float  # cosine of the two questions' embeddings


class _TenantSessions:
    def __init__(self, dim: int) -> None:
        self.records: list[SessionRecord] = []
        self.vectors = np.zeros((0, dim), dtype=np.float32)  # [n, dim], row i = records[i]

    def add(self, record: SessionRecord, vector: np.ndarray, capacity: int) -> None:
        self.records.append(record)
        self.vectors = np.concatenate([self.vectors, vector.reshape(1, -1)])
        if len(self.records) > capacity:  # oldest first out
            excess = len(self.records) - capacity
            self.records = self.records[excess:]
            self.vectors = np.ascontiguousarray(self.vectors[excess:])

    def drop(self, doc_id: str) -> int:
        """Remove the sessions a forget of ``doc_id`` covers; how many were removed."""
        keep = [i for i, r in enumerate(self.records) if not grounded_on(r.doc_ids, doc_id)]
        dropped = len(self.records) - len(keep)
        if dropped:
            self.records = [self.records[i] for i in keep]
            self.vectors = np.ascontiguousarray(self.vectors[keep])  # [kept, dim]
        return dropped

    def search(self, query: np.ndarray, m: int, supported_only: bool) -> list[ScoredSession]:
        if m <= 0 or not self.records:
            return []
        scores = self.vectors @ query.reshape(-1)  # [n]
        order = np.argsort(-scores, kind="stable")
        top = [i for i in order if self.records[i].supported or not supported_only][:m]
        return [ScoredSession(self.records[i], float(scores[i])) for i in top]


class PastSessions:
    """The retriever's event applier. Thread-safe."""

    def __init__(self, embedder: Encoder, max_per_tenant: int, max_event_ids: int,
                 tenant_event_ids: int | None = None) -> None:
        self._embedder = embedder
        self._dim = embedder.dim
        self._max_per_tenant = max_per_tenant
        self._max_event_ids = max_event_ids  # applied event ids kept in all
        self._tenant_event_ids = tenant_event_ids or max_event_ids  # ... and per tenant (None: the total)
        self._tenants: dict[str, _TenantSessions] = {}
        # applied event ids per tenant, oldest first: one tenant's flood pushes out only its own
        self._applied = TenantIds(self._tenant_event_ids, max_event_ids)
        self._ledger = ForgetLedger()  # forgets applied and their horizons
        self._lock = threading.Lock()

    def _seen(self, tenant: str, event_id: str) -> bool:
        with self._lock:
            return (tenant, event_id) in self._applied

    def apply(self, event: events_pb2.GenerationCompleted | events_pb2.ForgetRequested) -> bool:
        """Index (question -> answer) for the event's tenant, or apply a forget; False if this event id
        was applied before.

        Events without tenant, question or answer text (raw Generate calls), and answers that began
        before a forget covering them, are recorded as applied and index nothing.
        """
        if isinstance(event, events_pb2.ForgetRequested):
            return self.forget(event)
        if not event.event_id:
            raise ValueError("GenerationCompleted without event_id cannot be deduplicated")
        if self._seen(event.tenant, event.event_id):
            return False
        with self._lock:
            covered = self._ledger.covers(event)
        usable = bool(event.tenant and event.question.strip() and event.answer_text.strip()) and not covered
        vector = self._embedder.encode_one(event.question) if usable else None  # outside the lock: slow
        with self._lock:
            if not self._applied.add(event.tenant, event.event_id):  # applied meanwhile by another thread
                return False
            if vector is not None and not self._ledger.covers(event):  # again: a forget may have come meanwhile
                record = SessionRecord(event.event_id, event.question, cut_answer(event.answer_text),
                                       event.created_unix_ms, tuple(dict.fromkeys(event.doc_ids)),
                                       bool(event.citations))
                tenant = self._tenants.setdefault(event.tenant, _TenantSessions(self._dim))
                tenant.add(record, vector, self._max_per_tenant)
        return True

    def forget(self, event: events_pb2.ForgetRequested) -> bool:
        """Drop the tenant's sessions (all, or those grounded on ``event.doc_id``); False (nothing
        changed) when this forget was applied before."""
        with self._lock:
            if not self._ledger.admit(event):
                return False
            sessions = self._tenants.get(event.tenant)
            dropped = sessions.drop(event.doc_id) if sessions is not None else 0
            if sessions is not None and not sessions.records:
                del self._tenants[event.tenant]
        log.info("forgot %d past sessions of tenant %r (%s)", dropped, event.tenant,
                 f"document {event.doc_id!r}" if event.doc_id else "all")
        return True

    def search(self, tenant: str, query: np.ndarray, m: int, supported_only: bool = False) -> list[ScoredSession]:
        """Top-m past sessions of ``tenant`` for a question vector [1, dim], best first; ``supported_only``:
        only answers their passages support (what a prompt may show)."""
        with self._lock:
            sessions = self._tenants.get(tenant)
            return sessions.search(query, m, supported_only) if sessions is not None else []

    def count(self, tenant: str | None = None) -> int:
        """Sessions of one tenant, or of all tenants when ``tenant`` is None."""
        with self._lock:
            if tenant is not None:
                sessions = self._tenants.get(tenant)
                return len(sessions.records) if sessions is not None else 0
            return sum(len(s.records) for s in self._tenants.values())

    def tenants(self) -> list[str]:
        with self._lock:
            return sorted(self._tenants)

    def snapshot(self) -> bytes:
        """Full state (sessions, their vectors, applied event ids) as bytes for ``restore``."""
        with self._lock:
            names = sorted(self._tenants)
            meta = {
                "version": SNAPSHOT_VERSION,
                "dim": self._dim,
                "applied": self._applied.to_json(),  # [tenant, event id] pairs
                "forgets": self._ledger.to_json(),
                "tenants": [[name, [asdict(r) for r in self._tenants[name].records]] for name in names],
            }
            arrays = {f"v{i}": self._tenants[name].vectors for i, name in enumerate(names)}
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        return buf.getvalue()

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot; raises ValueError on a malformed one."""
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes())
            vectors = {key: np.ascontiguousarray(npz[key], dtype=np.float32) for key in npz.files if key != "meta"}
        if meta.get("version") not in READABLE_VERSIONS or meta.get("dim") != self._dim:
            raise ValueError(f"snapshot version {meta.get('version')} / dim {meta.get('dim')} not supported here")
        tenants: dict[str, _TenantSessions] = {}
        for i, (name, records) in enumerate(meta["tenants"]):
            sessions = _TenantSessions(self._dim)
            sessions.records = [SessionRecord(**{**r, "doc_ids": tuple(r.get("doc_ids", ()))}) for r in records]
            sessions.vectors = vectors[f"v{i}"]
            if sessions.vectors.shape != (len(sessions.records), self._dim):
                raise ValueError(
                    f"snapshot tenant {name!r}: {sessions.vectors.shape[0]} vectors for "
                    f"{len(sessions.records)} sessions"
                )
            tenants[name] = sessions
        applied = TenantIds.from_json(meta["applied"], self._tenant_event_ids, self._max_event_ids)
        ledger = ForgetLedger.from_json(meta.get("forgets"))
        with self._lock:
            self._tenants = tenants
            self._applied = applied
            self._ledger = ledger
        log.info(
            "restored %d past sessions of %d tenants",
            sum(len(s.records) for s in tenants.values()),
            len(tenants),
        )
