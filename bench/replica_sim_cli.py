"""``lookahead-rag-bench replica-sim``: tenant routing beyond one machine, on paper (bench/replica_sim.py).

    lookahead-rag-bench replica-sim --costs results/replicas.json [--replicas 10,30,100] [--tenants 1000] \\
        [--zipf 1.1] [--requests 20000] [--ttft-p99-s 2] --json results/replica_sim.json

The costs are the ones ``bench serve --replicas`` measured (its JSON's tenant routing, else round
robin, at its highest level: prefill per missed token, step cost by batch, tokens per step, prompt and
answer length, the warm prefix-hit share). First each policy's capacity: the highest arrivals per
second per replica at which TTFT p99 stays under ``--ttft-p99-s`` (default: 3 x one cold prompt's
prefill alone at the measured cost, so the target means the same on any machine) on the smallest replica count, and
so the replicas one needs per 1,000 requests/s. Then, at round robin's capacity per replica (the load
a plain balancer can just take), every replica count: prefix-hit fraction, goodput and TTFT p50/p99
per policy. A table, the JSON (``"kind": "replica_sim"``) and a PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lookahead_rag.bench.common import cpu_name, machine, print_table
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.replica_costs import Costs
from lookahead_rag.bench.replica_sim import POLICIES, SimConfig, capacity, simulate

PER = 1_000.0  # requests / s the replica count is given for
AUTO_TARGET = 3.0  # default TTFT p99 target: this many cold-prompt prefills (attainable whatever the machine)


def costs_of(path: str) -> tuple[Costs, str]:
    """The measured costs in a ``serve --replicas`` JSON, and where they came from."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    c = max(data["levels"], key=int)
    for routing in ("tenant", "round_robin"):
        measured = data["levels"][c].get(routing, {}).get("costs")
        if measured:
            return Costs.from_json(measured), f"{path}: c={c} {routing} ({data.get('model')}, {data.get('cpu')})"
    raise SystemExit(f"{path}: no measured costs (run bench serve --replicas with this version)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag-bench replica-sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--costs", required=True, help="a bench serve --replicas JSON (its measured per-request costs)")
    p.add_argument("--replicas", default="10,30,100", help="comma-separated replica counts")
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--zipf", type=float, default=1.1, help="tenant popularity exponent")
    p.add_argument("--requests", type=int, default=20_000, help="arrivals simulated per run")
    p.add_argument("--cache-tenants", type=int, default=64, help="tenants one replica's prefix cache holds")
    p.add_argument("--max-running", type=int, default=16, help="requests in one replica's batch")
    p.add_argument("--bound", type=float, default=1.25, help="bounded: x the mean calls in flight")
    p.add_argument("--ttft-p99-s", type=float, default=0.0, help="the TTFT p99 a replica must keep "
                   f"(0: {AUTO_TARGET:g} x one cold prompt's prefill alone, at the measured cost)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="write the result here (and the PNG beside it)")
    p.add_argument("--png", default="", help="the PNG (default: beside --json)")
    args = p.parse_args(argv)
    args.replica_counts = sorted({int(r) for r in args.replicas.split(",") if r.strip()})
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    costs, source = costs_of(args.costs)
    target = args.ttft_p99_s or AUTO_TARGET * costs.prompt_tokens * costs.prefill_s_per_token
    base = SimConfig(replicas=args.replica_counts[0], rate_per_s=1.0, requests=args.requests, tenants=args.tenants,
                     zipf=args.zipf, cache_tenants=args.cache_tenants, max_running=args.max_running,
                     bound=args.bound, seed=args.seed)
    caps = {p: capacity(costs, p, target, base) for p in tqdm(POLICIES, desc="capacity", leave=False)}
    # per replica: what round robin can just take (else the least any policy can)
    load = caps["round_robin"] or min((v for v in caps.values() if v), default=1.0)
    runs: dict[str, dict[str, Any]] = {}
    todo = [(r, p) for r in args.replica_counts for p in POLICIES]
    for r, policy in tqdm(todo, desc="replica counts", leave=False):
        cfg = replace(base, replicas=r, rate_per_s=load * r)
        runs.setdefault(str(r), {})[policy] = simulate(cfg, costs, policy).__dict__
    return {
        "kind": "replica_sim", "costs": costs.to_json(), "costs_from": source, "tenants": args.tenants,
        "zipf": args.zipf, "requests": args.requests, "cache_tenants": args.cache_tenants,
        "max_running": args.max_running, "bound": args.bound, "ttft_p99_target_s": round(target, 3),
        "capacity_per_replica": {p: round(v, 3) for p, v in caps.items()},
        "replicas_per_1000_rps": {p: round(PER / v, 1) if v else None for p, v in caps.items()},
        "load_per_replica": round(load, 3), "runs": runs, "baseline": "round_robin",
        "machine": machine(), "cpu": cpu_name(), "model": "simulated (costs measured: see costs_from)",
        "threads": "n/a (simulation)",
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data = run(args)
    print(f"costs from {data['costs_from']}: {data['costs']}")
    print_table([{"policy": p, "cap": data["capacity_per_replica"][p], "per": data["replicas_per_1000_rps"][p]}
                 for p in POLICIES], [("policy", "policy", "s"), ("cap", "req/s per replica", ".3f"),
                                      ("per", "replicas per 1000 req/s", ".1f")])
    print(f"at {data['load_per_replica']:.3f} req/s per replica (round robin's capacity):")
    print_table([{"replicas": int(r), "policy": p, **w} for r, ws in data["runs"].items() for p, w in ws.items()],
                [("replicas", "replicas", "d"), ("policy", "policy", "s"), ("hit_fraction", "prefix hits", ".3f"),
                 ("goodput_tokens_per_s", "tok/s", ".1f"), ("ttft_p50_s", "TTFT p50", ".3f"),
                 ("ttft_p99_s", "TTFT p99", ".3f"), ("completed", "done", "d")])
    write_outputs(data, args.json or None, args.png or None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
