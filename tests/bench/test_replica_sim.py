"""The replica simulation (bench/replica_sim.py) and the costs it is driven by (bench/replica_costs.py):
tenant hashing keeps a tenant's prefix on one replica, bounded load spills a hot tenant, rendezvous
ranking moves only a leaving replica's tenants, and the costs are fitted from the server's stats."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lookahead_rag.bench.replica_costs import Costs, measure
from lookahead_rag.bench.replica_sim import POLICIES, SimConfig, capacity, ranking, simulate
from lookahead_rag.bench.serve_stats import EngineStats, RequestRecord

COSTS = Costs(prefill_s_per_token=0.002, step_s_base=0.04, step_s_per_request=0.01, tokens_per_step=2.0,
              prompt_tokens=400.0, new_tokens=32.0, warm_hit_fraction=0.8)


def test_tenant_hashing_hits_the_prefix_cache_more_than_round_robin() -> None:
    cfg = SimConfig(replicas=8, rate_per_s=4.0, requests=1500, tenants=64, cache_tenants=6)
    hits = {p: simulate(cfg, COSTS, p).hit_fraction for p in POLICIES}
    assert hits["tenant"] > 1.5 * hits["round_robin"]
    assert hits["bounded"] > hits["round_robin"]


def test_bounded_load_spills_a_hot_tenant_and_cuts_its_tail() -> None:
    # one tenant sends nearly everything: hashing alone piles it on one replica
    cfg = SimConfig(replicas=4, rate_per_s=6.0, requests=1500, tenants=50, zipf=4.0, cache_tenants=8)
    tenant, bounded = simulate(cfg, COSTS, "tenant"), simulate(cfg, COSTS, "bounded")
    assert bounded.ttft_p99_s < tenant.ttft_p99_s
    assert bounded.completed == tenant.completed == cfg.requests


def test_a_leaving_replica_moves_only_its_own_tenants() -> None:
    for tenant in range(200):
        before, after = ranking(tenant, 10)[0], ranking(tenant, 9)[0]
        assert after == before or before == 9


def test_more_load_than_capacity_breaks_the_ttft_target() -> None:
    base = SimConfig(replicas=4, rate_per_s=1.0, requests=600, tenants=40, cache_tenants=8)
    cap = capacity(COSTS, "round_robin", 2.0, base, iterations=4)
    assert cap > 0
    over = simulate(replace(base, rate_per_s=3 * cap * base.replicas), COSTS, "round_robin")
    assert over.ttft_p99_s > 2.0


def record(prompt: int, hits: int, batch: float, step_s: float, steps: int, prefill_s: float) -> RequestRecord:
    stats = EngineStats(new_tokens=2 * steps, forward_steps=steps, prefix_hit_tokens=hits, mean_batch_size=batch,
                        server={"prefill_s": prefill_s, "wall_s": prefill_s + steps * step_s})
    return RequestRecord(0, 0.0, prompt_ids=list(range(prompt)), output_ids=list(range(2 * steps)), stats=stats)


def test_costs_are_fitted_from_the_servers_stats() -> None:
    # step time = 0.03 + 0.01 x batch exactly; 100 missed tokens cost 0.2 s
    records = [record(200, 100, b, 0.03 + 0.01 * b, 10, 0.2) for b in (1.0, 2.0, 4.0)]
    costs = measure(records)
    assert costs is not None
    assert costs.step_s_base == pytest.approx(0.03) and costs.step_s_per_request == pytest.approx(0.01)
    assert costs.prefill_s_per_token == pytest.approx(0.002)
    assert costs.tokens_per_step == pytest.approx(2.0) and costs.warm_hit_fraction == pytest.approx(0.5)
    assert Costs.from_json(costs.to_json()).step_s(3) == pytest.approx(costs.step_s(3))
