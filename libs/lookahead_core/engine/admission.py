"""The serving engine's bounded waiting queue, shared fairly between tenants.

Pure bookkeeping: no threads, no clock. The caller holds its own lock around every call and
passes the time in (``expire``) and the running requests per tenant (``pop``).

Fair share: ``pop`` serves the tenant with the fewest running requests; among equals, round
robin (a tenant joins the rotation's tail when its first request starts waiting and goes back to
the tail each time one of its requests is popped). Within a tenant, requests leave in FIFO order.
So one tenant's burst never starves another tenant's single request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from .sched_config import SchedulerConfig

T = TypeVar("T")


class QueueFull(Exception):
    """The waiting queue holds ``max_waiting`` requests: reject the new one at once."""


@dataclass(slots=True, eq=False)  # compared by identity: deque.remove finds this very entry
class _Entry(Generic[T]):
    """One waiting request."""

    seq: int  # push order over the whole queue (FIFO within a tenant, order of expire's result)
    item: T  # the caller's request
    deadline: float | None  # expires once the caller's clock reaches this; None = never


@dataclass(slots=True)
class _Tenant(Generic[T]):
    """One tenant's waiting requests and its place in the round robin."""

    rank: int  # lower goes first among tenants with equally many running requests
    entries: deque[_Entry[T]] = field(default_factory=deque)  # FIFO


class FairQueue(Generic[T]):
    """At most ``max_waiting`` waiting requests; fair share by tenant (see the module doc).

    Requests are matched by identity (``is``) in ``remove``, so equal-valued requests stay distinct.
    """

    def __init__(self, max_waiting: int) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.max_waiting = max_waiting
        self._tenants: dict[str, _Tenant[T]] = {}  # only tenants with waiting requests
        self._size = 0  # waiting requests over all tenants
        self._tick = 0  # counter for push order and round-robin ranks

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def __len__(self) -> int:
        return self._size

    def push(self, tenant: str, item: T, deadline: float | None = None) -> None:
        """Queue ``item`` for ``tenant``; raise QueueFull when ``max_waiting`` are already waiting."""
        if self._size >= self.max_waiting:
            raise QueueFull(f"waiting queue is full ({self.max_waiting} requests waiting)")
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(rank=self._next_tick())  # joins the rotation's tail
        state.entries.append(_Entry(self._next_tick(), item, deadline))
        self._size += 1

    def tenants(self) -> frozenset[str]:
        """The tenants with a request waiting."""
        return frozenset(self._tenants)

    def _next_name(self, running: Mapping[str, int], fits: Callable[[T], bool] | None) -> str | None:
        ready = [n for n, t in self._tenants.items() if fits is None or fits(t.entries[0].item)]
        return min(ready, key=lambda n: (running.get(n, 0), self._tenants[n].rank)) if ready else None

    def peek(self, running: Mapping[str, int], fits: Callable[[T], bool] | None = None) -> T | None:
        """What ``pop`` with the same arguments would return, left in the queue."""
        name = self._next_name(running, fits)
        return None if name is None else self._tenants[name].entries[0].item

    def pop(self, running: Mapping[str, int], fits: Callable[[T], bool] | None = None) -> T | None:
        """The next request to start (None if none waits): fewest running first, then round robin; with
        ``fits``, only among tenants whose next request fits now (the others' wait, in their order)."""
        name = self._next_name(running, fits)
        if name is None:
            return None
        state = self._tenants[name]
        entry = state.entries.popleft()
        state.rank = self._next_tick()  # back to the rotation's tail
        self._drop_if_empty(name)
        self._size -= 1
        return entry.item

    def remove(self, item: T) -> bool:
        """Take a waiting request out (a cancel frees its place at once); False if it is not waiting."""
        for name, state in self._tenants.items():
            for entry in state.entries:
                if entry.item is item:
                    state.entries.remove(entry)
                    self._drop_if_empty(name)
                    self._size -= 1
                    return True
        return False

    def expire(self, now: float) -> list[T]:
        """Remove and return (in push order) every waiting request whose deadline is <= ``now``."""
        expired: list[_Entry[T]] = []
        for name in list(self._tenants):
            state = self._tenants[name]
            keep: deque[_Entry[T]] = deque()
            for entry in state.entries:
                if entry.deadline is not None and entry.deadline <= now:
                    expired.append(entry)
                else:
                    keep.append(entry)
            state.entries = keep
            self._drop_if_empty(name)
        self._size -= len(expired)
        return [e.item for e in sorted(expired, key=lambda e: e.seq)]

    def _drop_if_empty(self, name: str) -> None:
        if not self._tenants[name].entries:
            del self._tenants[name]  # rejoins at the rotation's tail when it next pushes


def admits(held: Mapping[str, int], tenant: str, need: int, config: SchedulerConfig) -> bool:
    """Whether a request of ``tenant`` needing ``need`` KV bytes fits beside ``held`` (KV bytes by tenant; both the
    backend's figures, ``Backend.kv_bytes``) in the engine's budget and the tenant's share (its running places:
    engine/lending.py). Example: budget 4 MiB, share 0.5; a holds 1 MiB, b 1 MiB: a request of a needing 1 MiB may
    (a 2 MiB, all 3 MiB); one needing 1.5 MiB may not (a's share is 2 MiB)."""
    return sum(held.values()) + need <= config.kv_budget_bytes and held.get(tenant, 0) + need <= config.tenant_kv_bytes


@dataclass
class SchedulerState:
    """A snapshot of the engine for metrics and tests."""

    waiting: int  # requests in the queue
    running: int  # requests admitted (prefilling or decoding)
    kv_bytes: int  # bytes of KV running requests hold (the backend's figure: ``Backend.kv_bytes``)
    forwards: int  # forwards run since start
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache since start


class SchedulerClosed(RuntimeError):
    """The engine is shutting down and takes no new requests."""
