"""Hand-made results of ``bench serve --replicas`` and ``bench replica-sim`` (for the plot tests)."""

from __future__ import annotations

from typing import Any

COSTS = {"prefill_s_per_token": 0.002, "step_s_base": 0.04, "step_s_per_request": 0.01, "tokens_per_step": 2.0,
         "prompt_tokens": 400.0, "new_tokens": 32.0, "warm_hit_fraction": 0.8}


def serve_replicas() -> dict[str, Any]:
    def way(goodput: float, hits: int) -> dict[str, Any]:
        return {"completed": 32, "errors": {}, "goodput_tokens_per_s": goodput, "ttft_p50_s": 1.2,
                "ttft_p99_s": 4.0, "mean_accepted_per_step": 1.8, "prefix_hit_tokens": hits, "retries": 0,
                "costs": COSTS}

    return {"kind": "serve_replicas", "model": "tiny", "device": "cpu", "cpu": "Test CPU",
            "machine": "Linux, 2 cores", "threads": 2, "replicas": 2, "threads_per_replica": 1, "tenants": 8,
            "requests": 32, "max_new_tokens": 32, "bus": "in-process", "proxy": "haproxy", "baseline": "round_robin",
            "levels": {"4": {"round_robin": way(20.0, 1000), "tenant": way(24.0, 2500)}}}


def replica_sim() -> dict[str, Any]:
    def run(hit: float) -> dict[str, Any]:
        return {"hit_fraction": hit, "goodput_tokens_per_s": 500.0, "ttft_p50_s": 0.5, "ttft_p99_s": 2.0,
                "completed": 1000}

    runs = {str(r): {"round_robin": run(0.1), "tenant": run(0.7), "bounded": run(0.6)} for r in (10, 30)}
    return {"kind": "replica_sim", "costs": COSTS, "costs_from": "test", "tenants": 1000, "zipf": 1.1,
            "cache_tenants": 64, "ttft_p99_target_s": 2.0, "load_per_replica": 1.5, "runs": runs,
            "capacity_per_replica": {"round_robin": 1.5, "tenant": 2.0, "bounded": 2.2},
            "replicas_per_1000_rps": {"round_robin": 666.7, "tenant": 500.0, "bounded": 454.5},
            "machine": "Linux, 2 cores", "cpu": "Test CPU", "model": "simulated", "threads": "n/a"}
