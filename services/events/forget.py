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

Per tenant, so one tenant's forgets never push out another's (issue 22): each tenant keeps its own
document horizons and applied forget ids, at most ``MAX_TENANT_HORIZONS`` / ``MAX_TENANT_FORGET_IDS``;
past the ledger-wide ``MAX_HORIZONS`` / ``MAX_FORGET_IDS`` the tenant holding the most gives up its
oldest. A document horizon pushed out *folds* into its tenant's horizon of everything (an answer of
that tenant begun before it is dropped, whatever it was grounded on): the guarantee holds even for
the flooding tenant, it only drops more of its own. The JSON form lists ``[tenant, doc, ms]``
horizons and ``[tenant, event id]`` ids; a ledger saved before (bare ids) still loads
(``lookahead_rag.services.events.tenant_ids``).

Pure data: the consumers hold their own locks around a ledger.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lookahead_rag.services.events.tenant_ids import TenantIds
from lookahead_rag.v1 import events_pb2

MS_PER_S = 1000
CLOCK_SKEW_MS = 100  # answers starting this soon after a forget's horizon are dropped too (host clock skew)
MAX_HORIZONS = 100_000  # document horizons a ledger keeps in all; past it the tenant holding the most folds one
MAX_FORGET_IDS = 100_000  # forget event ids a ledger remembers in all; past it the tenant holding the most loses one
MAX_TENANT_HORIZONS = 10_000  # document horizons one tenant keeps; past it its oldest folds into its EVERYTHING
MAX_TENANT_FORGET_IDS = 10_000  # forget event ids remembered for one tenant; past it its oldest goes
EVERYTHING = ""  # the doc id of a forget of everything a tenant has

LEDGER_VERSION = 2  # 2: horizons and ids per tenant (ids as [tenant, id]); 1 (no version): bare ids

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


@dataclass
class TenantHorizons:
    """One tenant's horizons: of everything it has, and per document (oldest-set first)."""

    everything: int | None = None  # the latest forget of everything, or the latest horizon folded into it
    docs: OrderedDict[str, int] = field(default_factory=OrderedDict)  # doc id -> horizon (ms)

    def set(self, doc_id: str, ms: int) -> bool:
        """Raise the horizon of ``doc_id`` (EVERYTHING: of all) to ``ms``; True when a document was new."""
        if doc_id == EVERYTHING:
            self.everything = ms if self.everything is None else max(self.everything, ms)
            return False
        old = self.docs.pop(doc_id, None)
        self.docs[doc_id] = ms if old is None else max(old, ms)
        return old is None

    def fold_oldest(self) -> None:
        """Drop the oldest-set document horizon into the horizon of everything (covers more, never less)."""
        _, ms = self.docs.popitem(last=False)
        self.set(EVERYTHING, ms)

    def covers(self, started_ms: int, doc_ids: Iterable[str]) -> bool:
        """True when an answer begun at ``started_ms``, grounded on ``doc_ids``, began before a horizon."""
        horizons = [self.everything, *(self.docs.get(d) for d in doc_ids)]
        return any(h is not None and started_ms < h + CLOCK_SKEW_MS for h in horizons)


class ForgetLedger:
    """The forgets a consumer applied (by event id) and their horizons, per tenant; bounded, JSON-serializable."""

    def __init__(self, max_horizons: int = MAX_HORIZONS, max_ids: int = MAX_FORGET_IDS,
                 tenant_horizons: int = MAX_TENANT_HORIZONS, tenant_ids: int = MAX_TENANT_FORGET_IDS) -> None:
        self.max_horizons = max_horizons
        self.tenant_horizons = tenant_horizons
        self._tenants: dict[str, TenantHorizons] = {}
        self._doc_horizons = 0  # document horizons over all tenants
        self._ids = TenantIds(tenant_ids, max_ids)  # forget event ids, per tenant, oldest first

    @property
    def horizons(self) -> dict[Horizon, int]:
        """Every horizon (a copy): (tenant, doc id or EVERYTHING) -> ms."""
        out: dict[Horizon, int] = {}
        for tenant, t in self._tenants.items():
            if t.everything is not None:
                out[(tenant, EVERYTHING)] = t.everything
            out.update(((tenant, doc_id), ms) for doc_id, ms in t.docs.items())
        return out

    @property
    def applied(self) -> list[tuple[str, str]]:
        """(tenant, event id) of every forget remembered, each tenant's oldest first (a copy)."""
        return self._ids.pairs()

    def admit(self, event: events_pb2.ForgetRequested) -> bool:
        """Record a forget; False (nothing recorded) when its event id was admitted before."""
        if not event.event_id:
            raise ValueError("ForgetRequested without event_id cannot be deduplicated")
        if not event.tenant:
            raise ValueError("ForgetRequested without tenant")
        if not self._ids.add(event.tenant, event.event_id):
            return False
        self._set(event.tenant, event.doc_id, event.created_unix_ms)
        return True

    def covers(self, event: events_pb2.GenerationCompleted) -> bool:
        """True when ``event``'s answer began before a forget of its tenant or of one of its documents."""
        horizons = self._tenants.get(event.tenant)
        return horizons is not None and horizons.covers(started_unix_ms(event), event.doc_ids)

    def _set(self, tenant: str, doc_id: str, ms: int) -> None:
        """Raise a horizon, then fold the oldest past the tenant's cap and the ledger's (the heaviest tenant's)."""
        horizons = self._tenants.setdefault(tenant, TenantHorizons())
        self._doc_horizons += horizons.set(doc_id, ms)
        while len(horizons.docs) > self.tenant_horizons:
            self._fold(horizons)
        while self._doc_horizons > self.max_horizons:
            self._fold(max(self._tenants.values(), key=lambda t: len(t.docs)))

    def _fold(self, horizons: TenantHorizons) -> None:
        horizons.fold_oldest()
        self._doc_horizons -= 1

    def to_json(self) -> dict[str, Any]:
        return {"version": LEDGER_VERSION, "horizons": [[t, d, ms] for (t, d), ms in self.horizons.items()],
                "applied": self._ids.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ForgetLedger:
        """A ledger from ``to_json()`` output, also one saved before ledgers were per tenant (bare ids);
        None or {}: an empty one; raises ValueError when malformed."""
        ledger = cls()
        if not data:
            return ledger
        if not isinstance(data, dict):
            raise ValueError(f"malformed forget ledger: a {type(data).__name__}, not an object")
        try:
            for tenant, doc_id, ms in data.get("horizons", []):  # each tenant's oldest-set first
                ledger._set(str(tenant), str(doc_id), int(ms))
            ledger._ids = TenantIds.from_json(data.get("applied", []), ledger._ids.per_tenant, ledger._ids.total)
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
