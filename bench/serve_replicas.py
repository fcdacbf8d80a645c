"""``lookahead-rag-bench serve --replicas N --routing round_robin,tenant --replay FILE``: real replicas
behind the real proxy, one routing against another on the same prompts.

For each concurrency level and each routing, on fresh processes (cold caches): the shared draft cache
and N ``lookahead-rag serve generator`` processes (the engine threads split between them:
``--threads`` / N each, at least one; bench/replica_set.py), and HAProxy running
deploy/haproxy/haproxy.cfg with that routing (bench/haproxy_proxy.py): ``round_robin`` (each call to the
next replica, the baseline) or ``tenant`` (consistent hashing of the ``x-tenant`` header with bounded
loads: no replica above ``--balance-factor`` % of the average). Either way no tenant has more than
``--tenant-max-in-flight`` calls in flight (more: RESOURCE_EXHAUSTED at once). The closed-loop clients
(bench/serve_client.py) send the replayed prompts with ``Generate(prompt_ids)`` through the proxy, their
tenant as ``x-tenant``; a request that fails before its first token is sent again (up to ATTEMPTS).

``--tenants N`` gives the prompts N synthetic tenants: each distinct prompt belongs to one, by a hash
of its ids, so a repeated question comes back from the same tenant (0 keeps the recorded tenants).
With ``--kafka HOST:PORT`` finished answers feed the shared draft cache (each run its own topic);
without it each generator's events stay in its process and drafts come from the prompt alone.
Per routing: goodput, TTFT p50/p99, prefix-hit tokens, tokens/step, retries; a table, the JSON
(``"kind": "serve_replicas"``) and a PNG (bench/serve_replicas_plot.py).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from lookahead_rag.bench.common import cpu_name, machine, print_table
from lookahead_rag.bench.haproxy_proxy import HaproxyProxy, ProxyConfig
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.replica_costs import measure
from lookahead_rag.bench.replica_set import ReplicaConfig, ReplicaSet, lar_binary
from lookahead_rag.bench.serve_client import closed_loop
from lookahead_rag.bench.serve_load import ReplayPrompt
from lookahead_rag.bench.serve_stack import check_generator_overrides
from lookahead_rag.bench.serve_stats import RequestRecord, ratio, summarize
from lookahead_rag.services.events.kafka.broker import ensure_topics
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.topics import all_topics
from lookahead_rag.v1 import generator_pb2_grpc

ATTEMPTS = 3  # sends of a request that fails before its first token (a replica lost mid-run)
BASELINE = "round_robin"  # the routing the others are compared with
KAFKA_RUN_ENV = ("TOPIC", "DRAFTCACHE_GROUP", "GROUP_PREFIX")  # [kafka] fields made unique per run
COLUMNS = [
    ("c", "c", "d"), ("routing", "routing", "s"), ("completed", "done", "d"), ("errs", "errors", "s"),
    ("retries", "retries", "d"), ("goodput_tokens_per_s", "tok/s", ".2f"), ("ttft_p50_s", "TTFT p50", ".3f"),
    ("ttft_p99_s", "p99", ".3f"), ("mean_accepted_per_step", "tok/step", ".2f"),
    ("prefix_hit_tokens", "prefix hits", "d"),
]


def synthetic_tenants(prompts: list[ReplayPrompt], tenants: int) -> list[ReplayPrompt]:
    """Each distinct prompt given one of ``tenants`` tenants by a hash of its ids (0: as recorded)."""
    if tenants <= 0:
        return prompts
    out = []
    for p in prompts:
        key = zlib.crc32(",".join(map(str, p.prompt_ids)).encode()) % tenants
        out.append(replace(p, tenant=f"tenant-{key}"))
    return out


def kafka_env(run: str) -> dict[str, str]:
    """This run's own topic and consumer groups, so no run reads another's events."""
    prefix = f"bench-replicas.{run}"
    values = {"TOPIC": prefix, "DRAFTCACHE_GROUP": f"{prefix}.draftcache", "GROUP_PREFIX": f"{prefix}."}
    return {f"LAR_KAFKA_{k}": values[k] for k in KAFKA_RUN_ENV}


async def _load(proxy: HaproxyProxy, prompts: list[ReplayPrompt], c: int, args: argparse.Namespace,
                routing: str) -> tuple[list[RequestRecord], float]:
    async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
        stub = generator_pb2_grpc.GeneratorStub(channel)
        return await closed_loop(stub, prompts, c, args.mode, args.max_new_tokens, args.deadline_s,
                                 f"c={c} {routing}", attempts=ATTEMPTS)


def one_run(root: Path, prompts: list[ReplayPrompt], c: int, routing: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh replicas and proxy for one (level, routing); the summary of its records."""
    run = f"{uuid.uuid4().hex[:8]}-c{c}-{routing}"
    cfg = ReplicaConfig(root / run, args.replicas, threads_per_replica(args), kafka=args.kafka, model=args.model,
                        generator={k: str(v) for k, v in check_generator_overrides(args.gen).items()},
                        limits={"default_max_new_tokens": str(args.max_new_tokens)},
                        extra_env=kafka_env(run) if args.kafka else {})
    if args.kafka:  # this run's topics, before any consumer subscribes
        asyncio.run(ensure_topics(args.kafka, all_topics(KafkaSettings(bootstrap_servers=args.kafka,
                                                                       topic=f"bench-replicas.{run}"))))
    with ReplicaSet(cfg) as replicas:
        proxy_cfg = ProxyConfig(replicas.grpc_upstreams(), replicas.http_upstreams(), routing,
                                args.tenant_max_in_flight, args.balance_factor, log=cfg.root / "haproxy.log")
        with HaproxyProxy(proxy_cfg) as proxy:
            records, wall = asyncio.run(_load(proxy, prompts, c, args, routing))
    summary = summarize(records, wall, {})
    summary["retries"] = sum(r.retries for r in records)
    costs = measure(records)  # the per-request costs the simulation takes (bench/replica_sim.py)
    summary["costs"] = costs.to_json() if costs is not None else None
    return summary


def threads_per_replica(args: argparse.Namespace) -> int:
    from lookahead_core.threads import usable_cores

    return max(1, (args.threads or usable_cores()) // args.replicas)


def _rows(levels: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"c": int(c), "routing": routing, **w,
             "errs": ",".join(f"{k}:{n}" for k, n in w["errors"].items()) or "-"}
            for c, ways in levels.items() for routing, w in ways.items()]


def ratios(levels: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per level and routing other than the baseline: its figures over round robin's."""
    out: dict[str, dict[str, float | None]] = {}
    for c, ways in levels.items():
        base = ways.get(BASELINE, {})
        for routing, w in ways.items():
            if routing == BASELINE:
                continue
            out[f"{c}:{routing}"] = {
                "prefix_hit_tokens": ratio(w.get("prefix_hit_tokens"), base.get("prefix_hit_tokens")),
                "goodput": ratio(w.get("goodput_tokens_per_s"), base.get("goodput_tokens_per_s")),
                "ttft_p50": ratio(w.get("ttft_p50_s"), base.get("ttft_p50_s")),
                "ttft_p99": ratio(w.get("ttft_p99_s"), base.get("ttft_p99_s")),
            }
    return out


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (bench.serve_args dispatches here when --replicas > 0)."""
    prompts = synthetic_tenants(list(args.replayed.prompts), args.tenants)
    print(f"{len(prompts)} replayed prompts, {len({p.tenant for p in prompts})} tenants, {args.replicas} replicas "
          f"x {threads_per_replica(args)} thread(s), routings {', '.join(args.routings)} ({lar_binary()})")
    levels: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        for c in args.levels:
            levels[str(c)] = {routing: one_run(Path(tmp), prompts, c, routing, args) for routing in args.routings}
            print_table(_rows({str(c): levels[str(c)]}), COLUMNS)
    data = {
        "kind": "serve_replicas", "model": args.model, "device": "cpu", "cpu": cpu_name(), "machine": machine(),
        "threads": args.threads or threads_per_replica(args) * args.replicas, "replicas": args.replicas,
        "threads_per_replica": threads_per_replica(args), "tenants": len({p.tenant for p in prompts}),
        "requests": len(prompts), "max_new_tokens": args.max_new_tokens, "replay": args.replayed.describe(),
        "tenant_max_in_flight": args.tenant_max_in_flight, "balance_factor": args.balance_factor,
        "bus": f"kafka {args.kafka}" if args.kafka else "in-process",
        "proxy": "haproxy (deploy/haproxy/haproxy.cfg)", "baseline": BASELINE, "levels": levels,
        "ratios": ratios(levels),
    }
    print()
    print_table(_rows(levels), COLUMNS)
    print_table([{"key": k, **r} for k, r in data["ratios"].items()], [
        ("key", "c:routing", "s"), ("prefix_hit_tokens", "prefix hits / rr", ".2f"),
        ("goodput", "goodput / rr", ".2f"), ("ttft_p50", "TTFT p50 / rr", ".2f"), ("ttft_p99", "TTFT p99 / rr", ".2f")])
    write_outputs(data, args.json, args.png)  # JSON, and the PNG beside it (bench/serve_replicas_plot.py)
    return 0
