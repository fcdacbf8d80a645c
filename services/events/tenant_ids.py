"""Event ids remembered per tenant, bounded so that one tenant's flood pushes out only its own.

    ids = TenantIds(per_tenant=10_000, total=100_000)
    ids.add("acme", event_id)        # True once; False when ("acme", event_id) was added before
    ("acme", event_id) in ids        # also True for an id restored from a snapshot without tenants
    TenantIds.from_json(ids.to_json(), per_tenant, total)

Past ``per_tenant`` a tenant loses its own oldest id; past ``total`` the tenant holding the most ids
loses its oldest (a flooding tenant is that tenant long before anyone else loses one). Ids read from
snapshots written before ids were kept per tenant (bare strings) sit under ``LEGACY_TENANT``,
matched for every tenant, bounded by ``total`` only (they fade out as the heaviest "tenant").

Pure data: callers hold their own locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

LEGACY_TENANT = ""  # ids from snapshots without tenants; never a tenant's name (tenant names are not blank)


class TenantIds:
    """Per-tenant ordered sets of event ids (oldest first), at most ``per_tenant`` each, ``total`` in all."""

    def __init__(self, per_tenant: int, total: int) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError("per_tenant and total must be >= 1")
        self.per_tenant = per_tenant
        self.total = total
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, item: tuple[str, str]) -> bool:
        tenant, event_id = item
        return self._has(tenant, event_id)

    def count(self, tenant: str) -> int:
        """Ids remembered for ``tenant``."""
        return len(self._by_tenant.get(tenant, ()))

    def add(self, tenant: str, event_id: str) -> bool:
        """Remember ``event_id`` for ``tenant``; False (nothing changed) when it was remembered before."""
        if self._has(tenant, event_id):
            return False
        ids = self._by_tenant.setdefault(tenant, OrderedDict())
        ids[event_id] = None
        self._count += 1
        if tenant != LEGACY_TENANT and len(ids) > self.per_tenant:
            self._drop_oldest(tenant)
        while self._count > self.total:
            self._drop_oldest(max(self._by_tenant, key=lambda t: len(self._by_tenant[t])))
        return True

    def pairs(self) -> list[tuple[str, str]]:
        """(tenant, event id) of every id, each tenant's oldest first."""
        return [(tenant, event_id) for tenant, ids in self._by_tenant.items() for event_id in ids]

    def to_json(self) -> list[list[str]]:
        return [[tenant, event_id] for tenant, event_id in self.pairs()]

    @classmethod
    def from_json(cls, items: Iterable[Any], per_tenant: int, total: int) -> TenantIds:
        """From ``to_json()`` output, or a list of bare ids (a snapshot without tenants: ``LEGACY_TENANT``);
        raises ValueError when malformed."""
        ids = cls(per_tenant, total)
        try:
            for item in items:
                if isinstance(item, str):
                    ids.add(LEGACY_TENANT, item)
                else:
                    tenant, event_id = item
                    ids.add(str(tenant), str(event_id))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed event ids: {exc!r}") from exc
        return ids

    def _has(self, tenant: str, event_id: str) -> bool:
        ids, legacy = self._by_tenant.get(tenant), self._by_tenant.get(LEGACY_TENANT)
        return (ids is not None and event_id in ids) or (legacy is not None and event_id in legacy)

    def _drop_oldest(self, tenant: str) -> None:
        ids = self._by_tenant[tenant]
        ids.popitem(last=False)
        self._count -= 1
        if not ids:
            del self._by_tenant[tenant]
