"""Each tenant's recent prefill: prompt tokens it was granted, decaying with a half-life.

    usage = TenantUsage(half_life_s=10.0)
    plan = plan_step(..., usage=usage.at(now))      # {tenant: decayed tokens}: the least used prefills first
    usage.charge([(tenant, tokens), ...], now)       # what the step granted

Splitting a step's prefill room evenly between the tenants prefilling *now* still halves a light tenant's room
whenever a heavy one has prompts waiting, so its first token comes about twice as late for as long as the heavy
tenant keeps sending. Served least recent use first (as the "virtual token counter" of Sheng et al., OSDI '24,
and least-attained-service schedulers do), a tenant that asks for less than its share over the last few
half-lives gets its prompts through at once, and the heavy tenant gets the rest: max-min fair in rate, not only
per step. A tenant idle long enough decays to 0, equal to a new one.
"""

from __future__ import annotations

from collections.abc import Iterable

DROP_BELOW = 1.0  # a tenant whose decayed tokens fall below this is forgotten (equal to a new tenant)


def decayed(tokens: float, elapsed_s: float, half_life_s: float) -> float:
    """``tokens`` after ``elapsed_s`` seconds of halving every ``half_life_s``. Examples: (100, 10, 10) -> 50;
    (100, 0, 10) -> 100; (100, 30, 10) -> 12.5."""
    return tokens * 0.5 ** (max(0.0, elapsed_s) / half_life_s)


class TenantUsage:
    """Decayed prompt tokens granted per tenant (the engine's thread only)."""

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s = half_life_s
        self._tokens: dict[str, float] = {}  # tenant -> its decayed tokens as of ``_when``
        self._when = 0.0  # time.perf_counter() the values are decayed to

    def at(self, now: float) -> dict[str, float]:
        """Every remembered tenant's decayed tokens at ``now`` (a tenant not in it: 0)."""
        self._decay(now)
        return dict(self._tokens)

    def charge(self, granted: Iterable[tuple[str, int]], now: float) -> None:
        """Add each (tenant, prompt tokens) a step granted at ``now``."""
        self._decay(now)
        for tenant, tokens in granted:
            self._tokens[tenant] = self._tokens.get(tenant, 0.0) + tokens

    def _decay(self, now: float) -> None:
        elapsed, self._when = now - self._when, max(now, self._when)
        if elapsed <= 0:
            return
        self._tokens = {t: v for t, u in self._tokens.items() if (v := decayed(u, elapsed, self.half_life_s))
                        >= DROP_BELOW}
