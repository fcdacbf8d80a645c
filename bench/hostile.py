"""The hostile benchmark's run (what it measures and its command line: bench/hostile_args.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lookahead_core.threads import usable_cores

from lookahead_rag.bench.common import cpu_name, machine, print_table, ran_on
from lookahead_rag.bench.hog import victim_and_model, victim_stack, write_outputs
from lookahead_rag.bench.hostile_attack import AttackSpec, counts_json
from lookahead_rag.bench.hostile_mix import HoldCounts, UploadCounts
from lookahead_rag.bench.hostile_plot import plot
from lookahead_rag.bench.hostile_stack import Keys, make_keys, secured
from lookahead_rag.bench.hostile_targets import targets
from lookahead_rag.bench.hostile_victim import KeyedStub, documents_kept
from lookahead_rag.bench.serve_client import closed_loop
from lookahead_rag.bench.serve_load import SINGLE_TENANT
from lookahead_rag.bench.serve_stack import StackConfig
from lookahead_rag.bench.serve_stats import summarize
from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.telemetry.metric_group import NS
from lookahead_rag.v1 import generator_pb2_grpc

VICTIM = SINGLE_TENANT  # the victim: the workload's one tenant
UPLOADER = "uploader"  # the tenant uploading in a loop
WAYS = ("alone", "hostile")  # the victim alone (the baseline), then under the mix
ATTACK_MODULE = "lookahead_rag.bench.hostile_attack"  # the attackers' process
STOP_S = 10.0  # the attacker process's grace after SIGTERM (it writes its counts)
DEGRADED = f"{NS}_generator_degraded_total"  # answers given without a dependency, by dependency
COLUMNS = [("way", "run", "s"), ("completed", "done", "d"), ("errs", "errors", "s"),
           ("docs", "docs kept", "s"), ("degraded_retrieval", "no-docs", "d"),
           ("goodput_tokens_per_s", "tok/s", ".2f"), ("ttft_p50_s", "TTFT p50", ".3f"), ("ttft_p99_s", "p99", ".3f"),
           ("refused_calls", "big-title uploads", "s"), ("accepted_calls", "accepted uploads", "s"),
           ("held", "streams held", "s")]


@asynccontextmanager
async def attackers(spec: AttackSpec, root: Path, wait_s: float) -> AsyncIterator[dict[str, Any]]:
    """The attacker process (bench/hostile_attack.py) for the block's length: on exit it is told the victim is
    done, given ``wait_s`` for an accepted upload to finish, then stopped; the dict yielded gets its counts."""
    spec_path, out = root / "attack.json", root / "attack-counts.json"
    spec_path.write_text(spec.to_json())
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", ATTACK_MODULE, str(spec_path), str(out))
    counts: dict[str, Any] = {}
    try:
        yield counts
    finally:
        child.send_signal(signal.SIGUSR1)
        try:
            await asyncio.wait_for(child.wait(), wait_s)
        except TimeoutError:
            child.terminate()
            await asyncio.wait_for(child.wait(), STOP_S)
        if out.exists():
            counts |= json.loads(out.read_text())


async def one_way(args: argparse.Namespace, stack: StackConfig, keys: Keys, way: str, model: Any, tok: Any,
                  wl: Any, seq: list[Any]) -> dict[str, Any]:
    async with secured(stack, way, model, tok, wl.docs, keys) as (doors, pipeline), contextlib.AsyncExitStack() as ex:
        counts: dict[str, Any] = {}
        if way == "hostile":
            spec = AttackSpec(doors, UPLOADER, keys.uploader, [d.text for d in wl.docs[VICTIM]], args.doc_mib,
                              args.title_mib, pipeline.settings.http.max_body_bytes, VICTIM, args.hold_connections,
                              args.hold_streams, list(args.attackers))
            counts = await ex.enter_async_context(attackers(spec, stack.root, args.upload_wait_s))
            await asyncio.sleep(args.attack_lead_s)
        channel = open_channel(doors.grpc, pipeline.settings.generator.max_message_bytes)
        stub = KeyedStub(generator_pb2_grpc.GeneratorStub(channel), keys.victim)
        try:
            records, wall = await closed_loop(stub, seq, args.concurrency, "", args.max_new_tokens, args.deadline_s,
                                              f"victim {way}")
        finally:
            await channel.close()
        kept = documents_kept(records, stub.documents)
        result = {**summarize(records, wall, {}), "documents": kept, "via": doors.via}
    degraded = pipeline.registry.get_sample_value(DEGRADED, {"dependency": "retriever"}) or 0
    blank = counts_json(UploadCounts(), UploadCounts(), HoldCounts())
    return result | {"degraded_retrieval": int(degraded)} | blank | counts


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    where, wl, seq, model, tok = await victim_and_model(args)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as root:
        stack = await victim_stack(args, Path(root), wl)
        keys = make_keys(Path(root), VICTIM, UPLOADER)
        for way in WAYS:
            runs[way] = await one_way(args, stack, keys, way, model, tok, wl, seq)
    return {"kind": "hostile", "model": args.model, "device": where["device"], "dtype": args.dtype,
            "weights": where["weights"], "threads": args.threads or usable_cores(), "machine": machine(),
            "cpu": cpu_name(), "dataset": args.dataset, "requests": args.requests, "concurrency": args.concurrency,
            "max_new_tokens": args.max_new_tokens, "doc_mib": args.doc_mib, "title_mib": args.title_mib,
            "hold_connections": args.hold_connections, "hold_streams": args.hold_streams,
            "attackers": list(args.attackers),
            "generator": stack.generator, "runs": runs, "targets": targets(runs, args.requests, args.target_s)}


def outcomes(counts: dict[str, Any]) -> str:
    text = ",".join(f"{k}:{v}" for k, v in counts["outcomes"].items()) or "-"
    return text + (" +1 embedding" if counts.get("accepted_in_flight") else "")


def row(way: str, r: dict[str, Any]) -> dict[str, Any]:
    """One table row of a run."""
    hold = r["holder"]
    return {"way": way, **r, "errs": ",".join(f"{k}:{v}" for k, v in r["errors"].items()) or "-",
            "docs": f"{r['documents']['kept']}/{r['completed']}", "refused_calls": outcomes(r["refused"]),
            "accepted_calls": outcomes(r["accepted"]) + f" ({r['accepted']['chunks_embedded']} chunks)",
            "held": f"{hold['held_mean']} mean, {hold['held_peak']} peak" if hold["opened"] else "-"}


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (bench/hostile_args.py parses them without torch)."""
    data = asyncio.run(_run(args))
    print(f"\n{ran_on(data)}, victim: {data['requests']} requests x {data['concurrency']} clients through "
          f"{data['runs']['alone']['via']}; uploader: {data['doc_mib']:g} MiB documents, {data['title_mib']:g} MiB "
          f"titles; holder: {data['hold_connections']} x {data['hold_streams']} headers-only streams")
    print_table([row(w, r) for w, r in data["runs"].items()], COLUMNS)
    t = data["targets"]
    print(f"{t['verdict']}: TTFT p50 rise {t['ttft_p50_rise_s']} s, p99 rise {t['ttft_p99_rise_s']} s "
          f"(target <= {t['target_s']:g} s: {t['ttft_within']}); documents kept: {t['documents_kept']}; titles "
          f"refused naming title: {t['titles_refused']}; 4 MiB uploads accepted: {t['uploads_accepted']}; "
          f"streams held: {t['streams_held']}")
    write_outputs(args, data, plot)
    return 0
