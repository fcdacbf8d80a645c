"""Each tenant's recent share of the engine: seconds of forward time, decaying with a half-life.

    usage = TenantUsage(half_life_s=10.0)
    plan = plan_step(..., usage=usage.at(now))        # {tenant: decayed seconds}
    usage.charge(step_tokens(plan, tenant_of), seconds, now)   # the step's time, split by its tokens

A step's forward is shared: a chunk of one tenant's long prompt makes every other tenant's decode step in the
same forward as slow as the chunk. Splitting the prefill room evenly between the tenants prefilling *now* still
halves a light tenant's room and puts the heavy tenant's chunks in every one of its decode steps. Charged by
the forward time their tokens took, tenants are served as a weighted fair queue serves flows (the "virtual
token counter" of Sheng et al., OSDI '24, counts tokens the same way): the prefill room goes to the least
used first (``plan.fair_prefill``), and a tenant that used ``lead_s`` seconds more than a tenant decoding now
waits with its prompt until that tenant has caught up (``plan.prefill_chunks``), so a light tenant's steps
stay as short as alone for about half the time at worst. A tenant idle long enough decays to 0, as a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import StepPlan

DROP_BELOW_S = 1e-6  # a tenant whose decayed seconds fall below this is forgotten (equal to a new tenant)


def decayed(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` after ``elapsed_s`` seconds of halving every ``half_life_s``. Examples: (100, 10, 10) -> 50;
    (100, 0, 10) -> 100; (100, 30, 10) -> 12.5."""
    return value * 0.5 ** (max(0.0, elapsed_s) / half_life_s)


def split_by_tokens(tokens: Iterable[tuple[str, int]], seconds: float) -> dict[str, float]:
    """``seconds`` of one forward split between tenants by their tokens in it. Example: [(a, 256), (b, 2), (b, 2)],
    1.3 s -> {a: 1.28, b: 0.02}."""
    by_tenant: dict[str, int] = {}
    for tenant, n in tokens:
        by_tenant[tenant] = by_tenant.get(tenant, 0) + n
    total = sum(by_tenant.values())
    return {t: seconds * n / total for t, n in by_tenant.items()} if total > 0 else {}


def step_tokens(plan: StepPlan, tenant_of: Callable[[str], str]) -> list[tuple[str, int]]:
    """(tenant, tokens) of every request in a planned step: a decode's root, tree and extra rows; a chunk's
    prompt tokens."""
    decodes = [(tenant_of(d.id), 1 + len(d.tree) + (len(d.extra.ids) if d.extra is not None else 0))
               for d in plan.decodes]
    return decodes + [(tenant_of(c.id), c.end - c.first) for c in plan.chunks]


class TenantUsage:
    """Decayed forward seconds per tenant (the engine's thread only)."""

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s = half_life_s
        self._seconds: dict[str, float] = {}  # tenant -> its decayed seconds as of ``_when``
        self._when = 0.0  # time.perf_counter() the values are decayed to

    def at(self, now: float) -> dict[str, float]:
        """Every remembered tenant's decayed seconds at ``now`` (a tenant not in it: 0)."""
        self._decay(now)
        return dict(self._seconds)

    def charge(self, tokens: Iterable[tuple[str, int]], seconds: float, now: float) -> None:
        """Add a forward of ``seconds`` that ended at ``now``, split by each (tenant, tokens) it held."""
        self._decay(now)
        for tenant, share in split_by_tokens(tokens, seconds).items():
            self._seconds[tenant] = self._seconds.get(tenant, 0.0) + share

    def _decay(self, now: float) -> None:
        elapsed, self._when = now - self._when, max(now, self._when)
        if elapsed <= 0:
            return
        self._seconds = {t: v for t, u in self._seconds.items()
                         if (v := decayed(u, elapsed, self.half_life_s)) >= DROP_BELOW_S}
