"""Forgetting a tenant's derived data: the ``ForgetRequested`` event and what its consumers share.

    event = forget_event("acme", "json.dumps", request_id)      # doc id "": everything of the tenant
    grounded_on(output_doc_ids, event.doc_id)                    # does the forget cover this output?
    ledger = ForgetLedger()
    ledger.admit(event)         # False: this forget was applied before (idempotence by event id)
    ledger.covers(completed)    # True: the answer began before a forget covering it: do not keep it

A forget travels on the GENERATIONS stream under the tenant's key, so each consumer sees it in
order with the tenant's answers. Answers that began before the forget may still arrive after it
(decoding overlapped it, or an outbox resent one): the ledger keeps, per tenant and per (tenant,
document), the creation time of the latest forget (its *horizon*), and an answer that started
before a horizon covering it (its ``created_unix_ms - wall_s``, minus ``CLOCK_SKEW_MS`` of
tolerated clock skew between the generator's and the retriever's hosts) is dropped, never kept.
Dropping more is always safe: cached outputs and past sessions only make answers faster or richer.

Pure data: the consumers hold their own locks around a ledger.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from lookahead_rag.v1 import events_pb2

MS_PER_S = 1000
CLOCK_SKEW_MS = 100  # answers starting this soon after a forget's horizon are dropped too (host clock skew)
MAX_HORIZONS = 100_000  # (tenant, doc) horizons a ledger keeps; the oldest-set goes first past it
MAX_FORGET_IDS = 100_000  # forget event ids a ledger remembers; the oldest goes first past it
EVERYTHING = ""  # the doc id of a forget of everything a tenant has

Horizon = tuple[str, str]  # (tenant, doc id or EVERYTHING)


def forget_event(tenant: str, doc_id: str = EVERYTHING, request_id: str = "",
                 created_unix_ms: int | None = None) -> events_pb2.ForgetRequested:
    """A new ForgetRequested (fresh event id; created now unless given)."""
    created = int(time.time() * MS_PER_S) if created_unix_ms is None else created_unix_ms
    return events_pb2.ForgetRequested(event_id=uuid.uuid4().hex, tenant=tenant, doc_id=doc_id,
                                      created_unix_ms=created, request_id=request_id)


def grounded_on(doc_ids: Iterable[str], doc_id: str) -> bool:
    """True when a forget of ``doc_id`` covers an output grounded on ``doc_ids`` (EVERYTHING covers all)."""
    return doc_id == EVERYTHING or doc_id in doc_ids


def started_unix_ms(event: events_pb2.GenerationCompleted) -> int:
    """When the answer's request began (its retrieval included), on the generator's clock."""
    return int(event.created_unix_ms - event.stats.wall_s * MS_PER_S)


def horizon_keys(tenant: str, doc_ids: Sequence[str]) -> list[Horizon]:
    """The horizons that may cover an answer of ``tenant`` grounded on ``doc_ids``."""
    return [(tenant, EVERYTHING), *((tenant, d) for d in doc_ids if d != EVERYTHING)]


class ForgetLedger:
    """The forgets a consumer applied (by event id) and their horizons; bounded, JSON-serializable."""

    def __init__(self, max_horizons: int = MAX_HORIZONS, max_ids: int = MAX_FORGET_IDS) -> None:
        self.max_horizons = max_horizons
        self.max_ids = max_ids
        self.horizons: OrderedDict[Horizon, int] = OrderedDict()  # oldest-set first
        self.applied: OrderedDict[str, None] = OrderedDict()  # forget event ids, oldest first

    def admit(self, event: events_pb2.ForgetRequested) -> bool:
        """Record a forget; False (nothing recorded) when its event id was admitted before."""
        if not event.event_id:
            raise ValueError("ForgetRequested without event_id cannot be deduplicated")
        if not event.tenant:
            raise ValueError("ForgetRequested without tenant")
        if event.event_id in self.applied:
            return False
        self.applied[event.event_id] = None
        while len(self.applied) > self.max_ids:
            self.applied.popitem(last=False)
        key = (event.tenant, event.doc_id)
        self.horizons[key] = max(self.horizons.pop(key, event.created_unix_ms), event.created_unix_ms)
        while len(self.horizons) > self.max_horizons:
            self.horizons.popitem(last=False)
        return True

    def covers(self, event: events_pb2.GenerationCompleted) -> bool:
        """True when ``event``'s answer began before a forget of its tenant or of one of its documents."""
        started = started_unix_ms(event)
        for key in horizon_keys(event.tenant, list(event.doc_ids)):
            horizon = self.horizons.get(key)
            if horizon is not None and started < horizon + CLOCK_SKEW_MS:
                return True
        return False

    def to_json(self) -> dict[str, Any]:
        return {"horizons": [[t, d, ms] for (t, d), ms in self.horizons.items()], "applied": list(self.applied)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ForgetLedger:
        """A ledger from ``to_json()`` output (None or {}: an empty one); raises ValueError when malformed."""
        ledger = cls()
        if not data:
            return ledger
        try:
            for tenant, doc_id, ms in data.get("horizons", []):
                ledger.horizons[(str(tenant), str(doc_id))] = int(ms)
            ledger.applied.update((str(event_id), None) for event_id in data.get("applied", []))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed forget ledger: {exc!r}") from exc
        return ledger

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ForgetLedger:
        try:
            return cls.from_json(json.loads(data) if data else None)
        except json.JSONDecodeError as exc:
            raise ValueError(f"malformed forget ledger: {exc}") from exc
