"""Per-tenant quotas: requests per second (a token bucket) and concurrent streams. Pure logic, no I/O.

Each tenant gets the ``[limits]`` defaults (``tenant_rps``, ``tenant_burst``, ``tenant_streams``) or
its entry in ``tenant_quotas``; 0 means unlimited. A refusal is a ``ResourceExhausted`` with a
one-line message and ``retry_after_s`` (the status details carry it as a ``google.rpc.RetryInfo``,
HTTP as ``Retry-After``)::

    quotas = TenantQuotas.of(limits)                 # clock: time.monotonic unless given
    with quotas.admit("acme") as release:            # one request and one stream slot
        ...                                          # the slot is freed however the block ends,
        release()                                    # or earlier (once) when the request ends first
    quotas.check_rate("acme")                        # a unary call: the rate only

The clock is injectable, so the bucket arithmetic is tested with hand-made times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from lookahead_rag.services.common.errors import ResourceExhausted
from lookahead_rag.services.common.rules.limits import RequestLimits, TenantQuota

Clock = Callable[[], float]
Release = Callable[[], None]  # frees a request's stream slot (``TenantQuotas.admit``)
MAX_IDLE_TENANTS = 10_000  # tenants whose state is kept past their last request before the idle ones are dropped
MIN_CAPACITY = 1.0  # a bucket holds at least one request, however slow its rate


@dataclass(frozen=True)
class Quota:
    """One tenant's limits (0 = unlimited): ``rps`` requests per second, up to ``burst`` at once,
    ``streams`` open at the same time."""

    rps: float = 0.0
    burst: float = 0.0
    streams: int = 0

    @property
    def capacity(self) -> float:
        """Requests the bucket holds: ``burst``, else ``rps`` (at least one)."""
        return max(MIN_CAPACITY, self.burst or self.rps)


@dataclass
class TokenBucket:
    """``rate`` tokens per second up to ``capacity``; a request takes one. Starts full."""

    rate: float
    capacity: float
    tokens: float
    stamp: float  # when ``tokens`` was last brought up to date

    @classmethod
    def full(cls, quota: Quota, now: float) -> TokenBucket:
        return cls(quota.rps, quota.capacity, quota.capacity, now)

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)  # a clock that steps back adds nothing
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.stamp = max(self.stamp, now)

    def take(self, now: float) -> float:
        """Take one token: 0.0 when granted, else the seconds until one is there (nothing taken)."""
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def is_full(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.capacity


@dataclass
class TenantState:
    bucket: TokenBucket | None  # None: no rate limit
    open_streams: int = 0


class TenantQuotas:
    """The quotas of every tenant, enforced by one service (each service counts its own calls)."""

    def __init__(self, default: Quota, overrides: Mapping[str, Quota] | None = None,
                 stream_retry_s: float = 1.0, clock: Clock = time.monotonic) -> None:
        self.default = default
        self.overrides = dict(overrides or {})
        self.stream_retry_s = stream_retry_s  # hint when a tenant is at its stream limit: no exact time exists
        self.clock = clock
        self._tenants: dict[str, TenantState] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, limits: RequestLimits, clock: Clock = time.monotonic) -> TenantQuotas:
        """From the ``[limits]`` fields ``tenant_rps``, ``tenant_burst``, ``tenant_streams``, ``tenant_quotas``."""
        default = Quota(limits.tenant_rps, limits.tenant_burst, limits.tenant_streams)
        overrides = {t: override(default, q) for t, q in limits.tenant_quotas.items()}
        return cls(default, overrides, limits.tenant_streams_retry_s, clock)

    def quota(self, tenant: str) -> Quota:
        return self.overrides.get(tenant, self.default)

    def open_streams(self, tenant: str) -> int:
        with self._lock:
            state = self._tenants.get(tenant)
            return state.open_streams if state is not None else 0

    def check_rate(self, tenant: str) -> None:
        """Count one request against the tenant's rate; ResourceExhausted (with the wait) when over it."""
        quota = self.quota(tenant)
        if quota.rps:
            with self._lock:
                self._take(tenant, quota, self.clock())

    @contextmanager
    def admit(self, tenant: str) -> Iterator[Release]:
        """One request and one stream slot for the block; the slot is freed when the block ends,
        fails or is cancelled, or before, when the block calls the ``release`` it gets (thread-safe; the
        second call does nothing). A tenant at its stream limit is refused without using up its rate."""
        quota = self.quota(tenant)
        if not (quota.rps or quota.streams):
            yield _held_nothing
            return
        with self._lock:
            now = self.clock()
            if quota.streams and self._state(tenant, quota, now).open_streams >= quota.streams:
                raise ResourceExhausted(
                    f"tenant {tenant!r} has {quota.streams} streams open, its limit; retry when one ends",
                    retry_after_s=self.stream_retry_s,
                )
            state = self._take(tenant, quota, now)
            state.open_streams += 1
        held = [True]  # the slot, until released

        def release() -> None:
            with self._lock:
                if held:
                    held.clear()
                    state.open_streams -= 1

        try:
            yield release
        finally:
            release()

    def _state(self, tenant: str, quota: Quota, now: float) -> TenantState:
        state = self._tenants.get(tenant)
        if state is None:
            if len(self._tenants) >= MAX_IDLE_TENANTS:
                self._forget_idle(now)
            state = TenantState(TokenBucket.full(quota, now) if quota.rps else None)
            self._tenants[tenant] = state
        return state

    def _take(self, tenant: str, quota: Quota, now: float) -> TenantState:
        state = self._state(tenant, quota, now)
        if state.bucket is not None:
            wait = state.bucket.take(now)
            if wait > 0:
                raise ResourceExhausted(
                    f"tenant {tenant!r} is over its rate of {quota.rps:g} requests/s; retry in {wait:.2f} s",
                    retry_after_s=wait,
                )
        return state

    def _forget_idle(self, now: float) -> None:
        """Drop tenants with no open stream and a full bucket: a fresh state is the same as theirs."""
        idle = [t for t, s in self._tenants.items()
                if not s.open_streams and (s.bucket is None or s.bucket.is_full(now))]
        for tenant in idle:
            del self._tenants[tenant]


def _held_nothing() -> None:
    """The ``release`` of a tenant without quotas: no slot was taken."""


def override(default: Quota, fields: Mapping[str, float] | TenantQuota) -> Quota:
    """A tenant's quota: its ``tenant_quotas`` entry's fields over the defaults."""
    return Quota(float(fields.get("rps", default.rps)), float(fields.get("burst", default.burst)),
                 int(fields.get("streams", default.streams)))
