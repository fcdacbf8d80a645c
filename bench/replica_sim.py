"""A discrete-event simulation of generator replicas behind a routing proxy, driven by measured costs
(bench/replica_costs.py): what tenant routing does past the replicas one machine can run.

Requests arrive as a Poisson stream; each comes from one of ``tenants`` tenants drawn with Zipf
popularity. The proxy picks a replica:

- ``round_robin``: the next replica in turn (what a plain balancer does);
- ``tenant``: rendezvous hashing of the tenant (a plain hash of ``x-tenant``): the highest-ranked replica;
- ``bounded``: the same ranking, skipping a replica with more than ``bound`` x the mean calls in flight
  (consistent hashing with bounded loads: HAProxy's hash-balance-factor, Envoy's hash_balance_factor).

A replica works like the engine: back-to-back steps while it has work; each step admits waiting requests
up to ``max_running``, prefills the admitted ones whole (``prefill_s_per_token`` per token the prefix
cache misses) and advances every decoding request by ``tokens_per_step`` at ``step_s(batch)``. Its
prefix cache holds the last ``cache_tenants`` tenants it served (LRU): a request of one of them
prefills only ``1 - warm_hit_fraction`` of its prompt. Measured per policy: prefix-hit fraction of
prompt tokens, goodput (answer tokens / s), TTFT p50/p99 (arrival -> end of its prefill step).
"""

from __future__ import annotations

import heapq
import itertools
import random
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from lookahead_rag.bench.replica_costs import Costs
from lookahead_rag.bench.serve_stats import percentile

POLICIES = ("round_robin", "tenant", "bounded")
MAX_RATE_PER_REPLICA = 4096.0  # the capacity search gives up doubling here (requests / s / replica)
MIN_RATE_PER_REPLICA = 1e-3  # ... and halving here: no load meets the target (capacity 0)


@dataclass(frozen=True)
class SimConfig:
    """One simulated run."""

    replicas: int  # generator replicas behind the proxy
    rate_per_s: float  # arrivals per second, all replicas together (Poisson)
    requests: int = 20_000  # arrivals simulated
    tenants: int = 1_000  # tenants, Zipf-popular
    zipf: float = 1.1  # popularity exponent: tenant of rank r has weight 1 / r**zipf
    cache_tenants: int = 64  # tenants whose prefix KV one replica keeps (LRU)
    max_running: int = 16  # requests in one replica's batch ([generator] max_running)
    bound: float = 1.25  # bounded: skip a replica past bound x the mean calls in flight
    seed: int = 0  # arrivals and tenants


@dataclass
class _Request:
    arrival: float
    tenant: int
    missed: float = 0.0  # prompt tokens it prefilled
    left: float = 0.0  # answer tokens still to make
    first_token: float | None = None
    finished: float = 0.0


@dataclass
class _Replica:
    waiting: deque[_Request] = field(default_factory=deque)
    running: list[_Request] = field(default_factory=list)
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
    busy: bool = False

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)


@dataclass
class SimResult:
    """One policy's figures."""

    hit_fraction: float  # prompt tokens served from prefix caches / all prompt tokens
    goodput_tokens_per_s: float  # answer tokens of completed requests / (last completion - first arrival)
    ttft_p50_s: float  # arrival -> end of its prefill step, median
    ttft_p99_s: float  # ... 99th percentile
    completed: int  # requests finished


def ranking(tenant: int, replicas: int) -> list[int]:
    """The tenant's replicas, best first, by rendezvous hashing (stable as replicas come and go)."""
    return sorted(range(replicas), key=lambda r: zlib.crc32(f"{r}/{tenant}".encode()), reverse=True)


def arrivals(cfg: SimConfig) -> list[tuple[float, int]]:
    """(time, tenant) of every request: exponential gaps, Zipf tenants."""
    rng = random.Random(cfg.seed)
    weights = list(itertools.accumulate(1.0 / r**cfg.zipf for r in range(1, cfg.tenants + 1)))
    t, out = 0.0, []
    for _ in range(cfg.requests):
        t += rng.expovariate(cfg.rate_per_s)
        out.append((t, rng.choices(range(cfg.tenants), cum_weights=weights)[0]))
    return out


class Simulation:
    """One policy over one arrival stream."""

    def __init__(self, cfg: SimConfig, costs: Costs, policy: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
        self.cfg, self.costs, self.policy = cfg, costs, policy
        self.replicas = [_Replica() for _ in range(cfg.replicas)]
        self.ranks: dict[int, list[int]] = {}
        self.turn = 0
        self.events: list[tuple[float, int, int]] = []  # (time, order, replica): a step ends
        self.order = itertools.count()
        self.done: list[_Request] = []
        self.prompt_tokens = self.hit_tokens = 0.0

    def route(self, tenant: int) -> int:
        if self.policy == "round_robin":
            self.turn = (self.turn + 1) % self.cfg.replicas
            return self.turn
        ranks = self.ranks.setdefault(tenant, ranking(tenant, self.cfg.replicas))
        if self.policy == "tenant":
            return ranks[0]
        cap = self.cfg.bound * (sum(r.in_flight for r in self.replicas) + 1) / self.cfg.replicas
        return next((r for r in ranks if self.replicas[r].in_flight < cap), ranks[0])

    def _admit(self, rep: _Replica) -> float:
        """Move waiting requests into the batch; the seconds their prefill takes."""
        seconds = 0.0
        while rep.waiting and len(rep.running) < self.cfg.max_running:
            req = rep.waiting.popleft()
            warm = req.tenant in rep.cache
            hit = self.costs.prompt_tokens * self.costs.warm_hit_fraction if warm else 0.0
            req.missed, req.left = self.costs.prompt_tokens - hit, self.costs.new_tokens
            self.prompt_tokens += self.costs.prompt_tokens
            self.hit_tokens += hit
            rep.cache[req.tenant] = None
            rep.cache.move_to_end(req.tenant)
            while len(rep.cache) > self.cfg.cache_tenants:
                rep.cache.popitem(last=False)
            seconds += req.missed * self.costs.prefill_s_per_token
            rep.running.append(req)
        return seconds

    def _step(self, now: float, index: int) -> None:
        """Start replica ``index``'s next step at ``now`` (if it has work)."""
        rep = self.replicas[index]
        decoding = [r for r in rep.running if r.first_token is not None]
        prefill_s = self._admit(rep)
        if not rep.running:
            rep.busy = False
            return
        rep.busy = True
        end = now + prefill_s + (self.costs.step_s(len(decoding)) if decoding else 0.0)
        for req in rep.running:
            if req.first_token is None:
                req.first_token = end
            else:
                req.left -= self.costs.tokens_per_step
        heapq.heappush(self.events, (end, next(self.order), index))

    def _finish_step(self, now: float, index: int) -> None:
        rep = self.replicas[index]
        finished = [r for r in rep.running if r.left <= 0]
        rep.running = [r for r in rep.running if r.left > 0]
        for req in finished:
            req.finished = now
        self.done += finished
        self._step(now, index)

    def run(self) -> SimResult:
        stream = arrivals(self.cfg)
        for t, tenant in stream:
            while self.events and self.events[0][0] <= t:
                end, _, index = heapq.heappop(self.events)
                self._finish_step(end, index)
            index = self.route(tenant)
            self.replicas[index].waiting.append(_Request(t, tenant))
            if not self.replicas[index].busy:
                self._step(t, index)
        while self.events:
            end, _, index = heapq.heappop(self.events)
            self._finish_step(end, index)
        return self._result(stream[0][0] if stream else 0.0)

    def _result(self, start: float) -> SimResult:
        ttft = [r.first_token - r.arrival for r in self.done if r.first_token is not None]
        last = max((r.finished for r in self.done), default=start)
        span = max(last - start, 1e-9)
        return SimResult(
            hit_fraction=self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            goodput_tokens_per_s=len(self.done) * self.costs.new_tokens / span,
            ttft_p50_s=percentile(ttft, 50) or 0.0, ttft_p99_s=percentile(ttft, 99) or 0.0,
            completed=len(self.done))


def simulate(cfg: SimConfig, costs: Costs, policy: str) -> SimResult:
    return Simulation(cfg, costs, policy).run()


def capacity(costs: Costs, policy: str, ttft_p99_s: float, base: SimConfig, iterations: int = 8) -> float:
    """The highest arrivals per second per replica at which ``policy`` keeps TTFT p99 under ``ttft_p99_s``
    (bisection over the rate, on ``base``'s replicas and tenants)."""
    def meets(rate: float) -> bool:
        return simulate(_at(base, rate), costs, policy).ttft_p99_s <= ttft_p99_s

    lo, hi = 0.0, 1.0
    while hi > MIN_RATE_PER_REPLICA and not meets(hi):  # slow costs: start lower
        hi /= 2
    if hi <= MIN_RATE_PER_REPLICA:
        return 0.0
    while hi < MAX_RATE_PER_REPLICA and meets(hi):
        lo, hi = hi, hi * 2
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _at(base: SimConfig, per_replica: float) -> SimConfig:
    return replace(base, rate_per_s=per_replica * base.replicas)
