"""The exactness benchmark (what it measures and its command line: bench/exactness_args.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lookahead_core import DecodingConfig
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.kv.kvstore import KVShape
from lookahead_core.models import load_model
from tqdm import tqdm

from lookahead_rag.bench.common import placement, print_table, ran_on, run_header
from lookahead_rag.bench.engine_runner import TENANT, SchedulerRunner
from lookahead_rag.bench.exactness_args import CACHE_STATES
from lookahead_rag.bench.exactness_compare import compare_pass, margin_summary, min_margin
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.prompt_order import build_prompts, retriever_cores
from lookahead_rag.bench.serve_load import load_workload
from lookahead_rag.bench.ties import divergences
from lookahead_rag.services.retriever.prompt import PassageOrder

BASELINE = "hf_greedy"  # transformers' generate(do_sample=False), batch 1, on the stock model
MIB = 1 << 20
CACHE_HEADROOM = 2  # an "on" engine's prefix cache holds every prompt's KV this many times over (no eviction)
TOP2 = 2
OFF, ON, WARM = CACHE_STATES  # how a pass meets the prefix cache (bench/exactness_args.py)


@dataclass(frozen=True)
class Reference:
    """The baseline's answer of one prompt and its top-1/top-2 score margin at every output position."""

    tokens: list[int]
    margins: list[float]


@dataclass
class EnginePass:
    """One pass of every prompt through the engine."""

    name: str
    concurrency: int
    cache: str
    outputs: list[list[int]]
    prefix_hit_tokens: list[int]
    batch_sizes: list[float]  # each request's mean requests per forward it rode in
    forward_steps: int
    wall_s: float


def baseline_answer(model: Any, prompt_ids: Sequence[int], max_new: int) -> Reference:
    """Batch-1 greedy ``generate`` with its scores kept (output_scores): the tokens and each step's margin."""
    x = torch.tensor([list(prompt_ids)], device=model.device)  # [1, prompt]
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                             output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, x.shape[1]:].tolist()
    margins = []
    for scores in out.scores:  # one [1, vocab] per new token: what greedy took the argmax of
        best = torch.topk(scores[0].float(), TOP2).values
        margins.append(float(best[0] - best[1]))
    return Reference(tokens, margins)


def closed_loop(runner: SchedulerRunner, prompts: Sequence[list[int]], concurrency: int,
                desc: str) -> list[ServeRequest]:
    """Every prompt through the runner's engine, ``concurrency`` in flight (a new one as soon as one ends),
    the caller's thread driving the steps; the requests in prompt order."""
    pending = deque(enumerate(prompts))
    inflight: dict[int, ServeRequest] = {}
    done: list[ServeRequest | None] = [None] * len(prompts)
    with tqdm(total=len(prompts), desc=desc, leave=False) as bar:
        while pending or inflight:
            while pending and len(inflight) < concurrency:
                i, ids = pending.popleft()
                inflight[i] = ServeRequest(ids, runner.config, tenant=TENANT, trie=runner.trie)
                runner.scheduler.submit(inflight[i])
            runner.scheduler.step()
            for i, req in list(inflight.items()):
                if req.phase is Phase.DONE:
                    if req.error is not None:
                        raise req.error
                    done[i] = inflight.pop(i)
                    bar.update()
    return [r for r in done if r is not None]


def engine_pass(runner: SchedulerRunner, prompts: Sequence[list[int]], concurrency: int, cache: str) -> EnginePass:
    name = f"c{concurrency} {cache}"
    steps = runner.scheduler.forwards
    t0 = time.perf_counter()
    reqs = closed_loop(runner, prompts, concurrency, f"engine {name}")
    wall = time.perf_counter() - t0
    return EnginePass(name, concurrency, cache, [list(r.output) for r in reqs],
                      [r.stats.prefix_hit_tokens for r in reqs], [r.stats.mean_batch_size for r in reqs],
                      runner.scheduler.forwards - steps, wall)


def cache_bytes(model: Any, prompts: Sequence[list[int]], max_new: int, mb: int) -> int:
    """An ``on`` engine's prefix cache: ``mb`` MiB, or (0) room for every prompt's KV with headroom."""
    if mb:
        return mb * MIB
    tokens = sum(len(p) + max_new for p in prompts)
    return CACHE_HEADROOM * tokens * KVShape.of(model).bytes_per_token


def engine_passes(args: argparse.Namespace, model: Any, tok: Any, prompts: list[list[int]]) -> list[EnginePass]:
    """For each concurrency: prefix cache off, then a fresh cache filled (``on``) and read back (``warm``)."""
    config = DecodingConfig(max_new_tokens=args.max_new_tokens, mode=args.mode)
    on_bytes = cache_bytes(model, prompts, args.max_new_tokens, args.prefix_cache_mb)
    out = []
    for c in args.concurrency:
        for cached in (False, True):
            states = [s for s in args.cache if (s != OFF) == cached]
            if not states:
                continue
            sched = SchedulerConfig(max_running=c, prefix_cache_bytes=on_bytes if cached else 0,
                                    calibrate=args.calibrate)
            runner = SchedulerRunner(model, tok, config, None, sched)
            try:
                for state in (ON, WARM) if WARM in states else states:
                    result = engine_pass(runner, prompts, c, state)
                    if state in args.cache:  # an unreported "on" pass only fills the cache for "warm"
                        out.append(result)
            finally:
                runner.close()
    return out


def pass_record(p: EnginePass, refs: list[Reference], model: Any, prompts: list[list[int]],
                ids: list[str]) -> dict[str, Any]:
    """A pass's row in the JSON: counts, speed, prefix hits and every mismatch (margin, and the logit gap
    between the baseline's token and ours from a fresh batch-1 forward: bench/ties.py)."""
    tally = compare_pass(p.outputs, [r.tokens for r in refs], [r.margins for r in refs])
    gaps = {d.index: d.gap for d in divergences(model, [(m.index, prompts[m.index], p.outputs[m.index],
                                                         refs[m.index].tokens) for m in tally.mismatches])}
    tokens = sum(map(len, p.outputs))
    n = max(len(p.outputs), 1)
    return {
        "name": p.name, "concurrency": p.concurrency, "prefix_cache": p.cache, "answers": len(p.outputs),
        "exact": tally.exact, "exact_frac": round(tally.exact / n, 4), "mismatch_count": len(tally.mismatches),
        "mismatches": [m.record() | {"id": ids[m.index], "gap": gaps.get(m.index)} for m in tally.mismatches],
        "prefix_hit_tokens": sum(p.prefix_hit_tokens), "prompts_with_hits": sum(h > 0 for h in p.prefix_hit_tokens),
        "mean_hit_tokens": round(sum(p.prefix_hit_tokens) / n, 1),
        "mean_batch_size": round(sum(p.batch_sizes) / n, 2), "new_tokens": tokens, "forward_steps": p.forward_steps,
        "wall_s": round(p.wall_s, 2), "tokens_per_s": round(tokens / p.wall_s, 2) if p.wall_s else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    wl = load_workload(args.corpus, args.questions, args.limit, args.tenants_by_title)
    model, tok = load_model(args.model, **placement(args))
    with tempfile.TemporaryDirectory(prefix="bench-exactness-") as root:
        cores = retriever_cores(Path(root), args, wl, tok, (PassageOrder.CANONICAL,))
        prompts = build_prompts(cores, wl.pool, args.max_new_tokens)[PassageOrder.CANONICAL].prompts
        for core in cores.values():
            core.close()
    t0 = time.perf_counter()
    refs = [baseline_answer(model, ids, args.max_new_tokens) for ids in tqdm(prompts, desc=f"baseline {BASELINE}")]
    baseline_wall = time.perf_counter() - t0
    passes = engine_passes(args, model, tok, prompts)
    ids = [q.qid for q in wl.pool]
    smallest = [min_margin(r.margins) for r in refs]
    records = [pass_record(p, refs, model, prompts, ids) for p in passes]
    return {
        "kind": "exactness",  # what `lookahead-rag-bench plot` draws
        **run_header(args),
        "prompts": len(prompts), "tenants": len(wl.docs), "max_new_tokens": args.max_new_tokens,
        "mode": args.mode, "baseline": BASELINE, "calibrated": args.calibrate,
        "mean_prompt_tokens": round(sum(map(len, prompts)) / max(len(prompts), 1), 1),
        "baseline_new_tokens": sum(len(r.tokens) for r in refs), "baseline_wall_s": round(baseline_wall, 2),
        "margins": margin_summary([m for m, _ in smallest]),
        "mismatches_total": sum(r["mismatch_count"] for r in records),
        "passes": records,
        "per_answer": [{"id": q, "prompt_tokens": len(p), "new_tokens": len(r.tokens), "min_margin": m, "at": at}
                       for q, p, r, (m, at) in zip(ids, prompts, refs, smallest, strict=True)],
        "wall_s": round(time.perf_counter() - t_start, 1),
    }


COLUMNS = [
    ("name", "pass", "s"), ("concurrency", "clients", "d"), ("prefix_cache", "prefix cache", "s"),
    ("answers", "answers", "d"), ("exact", "exact", "d"), ("mismatch_count", "mismatches", "d"),
    ("mean_hit_tokens", "hit tok/prompt", ".1f"), ("mean_batch_size", "batch", ".2f"),
    ("tokens_per_s", "tok/s", ".2f"), ("wall_s", "wall s", ".1f"),
]


def report(args: argparse.Namespace) -> int:
    """Run, print the table and every mismatch, and write the JSON and its PNG when asked."""
    data = run(args)
    print()
    print_table(data["passes"], COLUMNS)
    m = data["margins"]
    print(f"{ran_on(data)}, {data['prompts']} prompts, {data['max_new_tokens']} new tokens, mode {data['mode']}; "
          f"baseline {data['baseline']} ({data['baseline_wall_s']} s)")
    print(f"smallest top-1/top-2 margin per answer: min {m['min']}, median {m['median']}; answers below "
          + ", ".join(f"{t}: {c}" for t, c in m["below"].items()))
    for p in data["passes"]:
        for mm in p["mismatches"]:
            print(f"MISMATCH {p['name']}: prompt #{mm['index']} ({mm['id']}) at token {mm['position']}: ours "
                  f"{mm['ours']}, baseline {mm['reference']}, margin {mm['margin']}, gap {mm['gap']}"
                  + (" (a tie)" if mm["tie"] else ""))
    print(f"{data['mismatches_total']} mismatch(es) in {len(data['passes'])} pass(es); wall {data['wall_s']} s")
    write_outputs(data, args.json, args.png)
    return 0


if __name__ == "__main__":
    from lookahead_rag.bench.exactness_args import main

    raise SystemExit(main(sys.argv[1:]))
