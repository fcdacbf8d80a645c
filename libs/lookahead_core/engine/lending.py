"""Running places lent to a tenant alone, given back the moment another tenant's request waits.

A tenant may hold ``tenant_running`` of the engine's ``max_running`` places (three quarters by default), so a
request of another tenant arriving later starts at once (issue 46). While no other tenant runs, waits or is
paused, the places kept for others would stand idle and the tenant's own requests would queue behind them: at 16
clients of one tenant a quarter of the requests waited for a place (issue 50: most of the first token's wait). So
with ``lend_places`` a tenant alone may fill every place. A lent place is given back as soon as another tenant's
request waits and would fit: the borrower's newest running request is paused (kept whole: its KV cache,
proposers and output; it is only left out of the steps) and the waiting request takes its place. A paused request
is stepped again, before any newer request of its tenant starts, once its tenant may hold one more place. Pausing
changes no token: a paused request's next step is the one it would have run (greedy and seeded sampling alike).

KV memory is not lent (a paused request keeps its cache, so lent memory could not be given back at once): each
tenant's KV share bounds it whether alone or not (``admission.admits``).

    plan = admission_round(running, queue, held, need, config)   # under the scheduler's lock
    for a in plan.pause: a.paused = True
    for a in plan.resume: a.paused = False
    plan.admit                                                     # popped from the queue: build them
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from .admission import FairQueue, admits

if TYPE_CHECKING:
    from .active import Active
    from .request import ServeRequest
    from .sched_config import SchedulerConfig


def alone(tenant: str, stepped: Mapping[str, int], paused: Mapping[str, int], waiting: Collection[str]) -> bool:
    """Whether no other tenant has a request stepped, paused or waiting. Example: stepped {a: 3}, paused {},
    waiting {a} -> a is alone; waiting {a, b} -> not (b's request waits)."""
    others = (t for t in (*stepped, *paused, *waiting) if t != tenant)
    return not any(stepped.get(t, 0) or paused.get(t, 0) or t in waiting for t in others)


def may_hold(tenant: str, stepped: Mapping[str, int], paused: Mapping[str, int], waiting: Collection[str],
             config: SchedulerConfig) -> bool:
    """Whether ``tenant`` may take one more place now: one is free, and the tenant is under its share or (with
    ``lend_places``) alone. Example: max_running 4, share 3, stepped {a: 3}: a may take the fourth place alone,
    not once b's request waits; b may."""
    if sum(stepped.values()) >= config.max_running:
        return False
    if stepped.get(tenant, 0) < config.tenant_running:
        return True
    return config.lend_places and alone(tenant, stepped, paused, waiting)


def borrower(stepped: Mapping[str, int], config: SchedulerConfig, asking: str) -> str | None:
    """The tenant other than ``asking`` holding the most places past its share (None: no one holds more than its
    share). Example: share 3, stepped {a: 4, b: 0}, asking b -> a; stepped {a: 3} -> None."""
    over = {t: n - config.tenant_running for t, n in stepped.items() if t != asking and n > config.tenant_running}
    return max(over, key=lambda t: over[t]) if over else None


@dataclass
class Round:
    """What one admission round decided: requests to start, running ones to pause and paused ones to resume."""

    admit: list[ServeRequest] = field(default_factory=list)  # popped from the queue, in start order
    pause: list[Active] = field(default_factory=list)  # lent places given back (their requests kept whole)
    resume: list[Active] = field(default_factory=list)  # paused requests stepped again, oldest first


def admission_round(running: Sequence[Active], queue: FairQueue[ServeRequest], held: Counter[str],
                    need: Callable[[ServeRequest], int], config: SchedulerConfig) -> Round:
    """Fill the free places: paused requests first among their tenant's, then waiting ones, fewest running first
    (``FairQueue``), each within its KV share (``held``: KV bytes by tenant, updated with what starts) and its
    places (``may_hold``); a waiting request that only a lent place keeps out takes it back (``borrower``'s newest
    request paused). ``running``: in admission order, paused ones included (``Active.paused``)."""
    out = Round()
    stepped = Counter(a.req.tenant for a in running if not a.paused)
    paused = [a for a in running if a.paused]  # oldest first
    while True:
        waiting, held_back = queue.tenants(), Counter(a.req.tenant for a in paused)
        fits = partial(_fits, held=held, need=need, stepped=stepped, paused=held_back, waiting=waiting,
                       config=config)
        nxt = queue.peek(stepped, fits)
        back = next((a for a in paused if may_hold(a.req.tenant, stepped, held_back, waiting, config)), None)
        if back is not None and (nxt is None or stepped[back.req.tenant] <= stepped[nxt.tenant]):
            paused.remove(back)
            out.resume.append(back)
            stepped[back.req.tenant] += 1
            continue
        if nxt is not None:
            queue.pop(stepped, fits)  # the request peek named
            held[nxt.tenant] += need(nxt)
            stepped[nxt.tenant] += 1
            out.admit.append(nxt)
            continue
        given = _give_back(running, paused, queue, held, need, stepped, config)
        if given is None:
            return out
        paused.append(given)
        out.pause.append(given)
        stepped[given.req.tenant] -= 1


def _fits(req: ServeRequest, held: Mapping[str, int], need: Callable[[ServeRequest], int],
          stepped: Mapping[str, int], paused: Mapping[str, int], waiting: Collection[str],
          config: SchedulerConfig) -> bool:
    """Whether ``req`` may start now: within its KV share and its places."""
    return admits(held, req.tenant, need(req), config) and may_hold(req.tenant, stepped, paused, waiting, config)


def _give_back(running: Sequence[Active], paused: Sequence[Active], queue: FairQueue[ServeRequest],
               held: Mapping[str, int], need: Callable[[ServeRequest], int], stepped: Counter[str],
               config: SchedulerConfig) -> Active | None:
    """The running request to pause so that a waiting one of another tenant, under its share and within its KV,
    takes its place: the newest of the tenant most over its share; None when places are not full, nothing of the
    kind waits, or no one borrows."""
    if sum(stepped.values()) < config.max_running:
        return None
    head = queue.peek(stepped, lambda r: admits(held, r.tenant, need(r), config)
                      and stepped[r.tenant] < config.tenant_running)
    owner = borrower(stepped, config, head.tenant) if head is not None else None
    if owner is None:
        return None
    return next((a for a in reversed(running) if a.req.tenant == owner and a not in paused), None)
