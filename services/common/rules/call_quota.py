"""Every RPC's quota class, in one table, and the per-tenant meter the servicers check calls with.

    meter = CallMeter.of(limits, "lookahead_rag.v1.DraftCache")  # per-tenant buckets of [limits] tenant_rps / burst
    meter.call("Fetch", request.tenant)   # the tenant's name checked; RESOURCE_EXHAUSTED past the rate
    await meter.run("Stats", request.tenant, store.stats)  # the same, then store.stats(tenant) in a thread

A ``stream`` call (Answer, Generate) is admitted by the generator's engine against the tenant's rate and
open streams (``TenantQuotas.admit``); a ``call`` (every unary read or write of a tenant's data) takes one
request of the tenant's rate in the service it reaches; an ``admin`` call (a snapshot of every tenant) is
not metered: only an admin key may make it. Each service counts its own calls. A method missing from the
table is refused by the auth guard (``scopes.py``) and metered here as a ``call``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from lookahead_rag.services.common.auth.scopes import GRPC_SCOPES, PACKAGE, Scope
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.rules.quota import TenantQuotas

T = TypeVar("T")


class QuotaClass(StrEnum):
    """How a call is metered."""

    STREAM = "stream"  # the tenant's rate and open streams, in the engine
    CALL = "call"  # the tenant's rate, in the service the call reaches
    ADMIN = "admin"  # not metered (admin keys only)


STREAM_METHODS = frozenset({f"/{PACKAGE}.Generator/Answer", f"/{PACKAGE}.Generator/Generate"})  # answer streams
# /package.Service/Method -> its quota class: every method the scopes table declares (scopes.py), by its scope
GRPC_QUOTA_CLASSES: dict[str, QuotaClass] = {
    method: QuotaClass.STREAM if method in STREAM_METHODS else QuotaClass.ADMIN if scope is Scope.ADMIN
    else QuotaClass.CALL
    for method, scope in GRPC_SCOPES.items()
}


def quota_class(method: str) -> QuotaClass:
    """The quota class of a gRPC method (its full name); one not in the table is a ``call``."""
    return GRPC_QUOTA_CLASSES.get(method, QuotaClass.CALL)


class CallMeter:
    """A service's per-tenant rate for its unary calls (``QuotaClass.CALL``)."""

    def __init__(self, quotas: TenantQuotas, limits: RequestLimits, service: str) -> None:
        self.quotas = quotas
        self.limits = limits  # whose tenant-name rule every metered call's tenant passes first
        self.service = service  # the service's full name ("lookahead_rag.v1.DraftCache"): its methods' prefix

    @classmethod
    def of(cls, limits: RequestLimits, service: str) -> CallMeter:
        return cls(TenantQuotas.of(limits), limits, service)

    def call(self, method: str, tenant: str) -> None:
        """Count a call of ``method`` (its short name) against ``tenant``'s rate, its name checked first
        ("": a call across every tenant, not metered by tenant)."""
        self.check(f"/{self.service}/{method}", self.limits.check_tenant(tenant) if tenant else tenant)

    async def run(self, method: str, tenant: str, work: Callable[..., T], *args: Any) -> T:
        """``call``, then the blocking ``work(tenant, *args)`` in a worker thread (a servicer's store or core
        call: the event loop stays free)."""
        self.call(method, tenant)
        return await asyncio.to_thread(work, tenant, *args)

    def check(self, method: str, tenant: str) -> None:
        """Take one request of ``tenant``'s rate for a ``call`` (ResourceExhausted with a retry hint past it)."""
        if quota_class(method) is QuotaClass.CALL:
            self.quotas.check_rate(tenant)
