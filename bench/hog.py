"""The hog benchmark's run (what it measures and its command line: bench/hog_args.py)."""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookahead_core.kv.kvstore import KVShape
from lookahead_core.models import load_model
from lookahead_core.threads import serve_single_threaded, usable_cores

from lookahead_rag.bench.common import cpu_name, machine, placement, print_table, ran_on, write_json
from lookahead_rag.bench.hog_plot import plot
from lookahead_rag.bench.serve_client import closed_loop, one_request
from lookahead_rag.bench.serve_load import ReplayPrompt, draw_sequence, load_workload
from lookahead_rag.bench.serve_stack import StackConfig, build_vector_cache, check_generator_overrides, serving
from lookahead_rag.bench.serve_stats import ratio, summarize

HOG_TENANT = "hog"  # the tenant doing its worst
WAYS = ("plain", "hog")  # the victim alone (the baseline), then beside the hog
CONTEXT_MARGIN = 64  # tokens a hog prompt leaves below the model's context besides its answer (a step's drafts)
FIRST_ID = 3  # the lowest token id a hog prompt draws (past the usual special tokens)
REFUSED_BACKOFF_S = 0.05  # a refused hog call is sent again after this pause (its highest rate that is not a spin)
HITS_DROP_TARGET = 0.10  # issue 46: the victim's prefix hits may fall by this fraction at most
COLUMNS = [("way", "run", "s"), ("completed", "done", "d"), ("errs", "errors", "s"),
           ("goodput_tokens_per_s", "tok/s", ".2f"), ("ttft_p50_s", "TTFT p50", ".3f"), ("ttft_p99_s", "p99", ".3f"),
           ("prefix_hit_tokens", "prefix hits", "d"), ("mean_accepted_per_step", "tok/step", ".2f"),
           ("hog_calls", "hog calls", "s")]


def hog_prompt_tokens(scheduler: Any, context: int, max_new: int) -> int:
    """The longest prompt the hog may send: within its share of the prefix cache (so it could be cached), its
    share of request KV (so it is admitted) and the model's context."""
    cfg, per_token = scheduler.config, KVShape.of(scheduler.model).bytes_per_token
    cached = int(cfg.prefix_cache_bytes * cfg.prefix_tenant_share) // per_token
    admitted = cfg.tenant_kv_bytes // per_token - max_new - CONTEXT_MARGIN
    return max(1, min(cached, admitted, context - max_new - CONTEXT_MARGIN))


async def hog(stub: Any, tokens: int, streams: int, max_new: int, vocab: int, seed: int, deadline_s: float,
              outcomes: Counter[str]) -> None:
    """``streams`` loops sending the hog's calls back to back until cancelled; each call's outcome counted."""
    rng = random.Random(seed)

    async def loop() -> None:
        while True:
            prompt = ReplayPrompt(HOG_TENANT, tuple(rng.randrange(FIRST_ID, vocab) for _ in range(tokens)))
            rec = await one_request(stub, -1, prompt, "", max_new, deadline_s)
            outcomes[rec.error or "OK"] += 1
            if rec.error is not None:
                await asyncio.sleep(REFUSED_BACKOFF_S)

    await asyncio.gather(*(loop() for _ in range(streams)))


async def one_way(args: argparse.Namespace, stack: StackConfig, way: str, model: Any, tok: Any, wl: Any,
                  seq: list[Any]) -> dict[str, Any]:
    async with serving(stack, way, model, tok, wl.docs) as (stub, pipeline):
        scheduler = pipeline.generator.scheduler
        context = int(getattr(model.config, "max_position_embeddings", 0) or tok.model_max_length)
        tokens = args.hog_prompt_tokens or hog_prompt_tokens(scheduler, context, args.hog_max_new)
        outcomes: Counter[str] = Counter()
        task = None
        if way == "hog":
            task = asyncio.create_task(hog(stub, tokens, args.hog_streams, args.hog_max_new,
                                           model.get_input_embeddings().num_embeddings, args.seed, args.deadline_s,
                                           outcomes))
        try:
            records, wall = await closed_loop(stub, seq, args.concurrency, "", args.max_new_tokens, args.deadline_s,
                                              f"victim beside {way}")
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        curve = scheduler.backend.curve
        chunk = scheduler.config.prefill_chunk
        return {**summarize(records, wall, {}), "hog_prompt_tokens": tokens, "hog_outcomes": dict(outcomes),
                "prefill_chunk": chunk, "prefill_chunk_s": round(curve.cost(chunk), 4) if curve is not None else None}


def targets(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The victim beside the hog against alone: hits kept and the TTFT p50 rise in prefill chunks."""
    plain, hogged = runs["plain"], runs["hog"]
    hits = ratio(hogged["prefix_hit_tokens"], plain["prefix_hit_tokens"])
    chunk_s = plain.get("prefill_chunk_s")
    rise = (hogged["ttft_p50_s"] - plain["ttft_p50_s"]
            if hogged["ttft_p50_s"] is not None and plain["ttft_p50_s"] is not None else None)
    return {"prefix_hits_kept": hits, "prefix_hits_within": hits is not None and hits >= 1.0 - HITS_DROP_TARGET,
            "ttft_p50_rise_s": None if rise is None else round(rise, 4),
            "ttft_p50_rise_chunks": round(rise / chunk_s, 3) if rise is not None and chunk_s else None,
            "ttft_within": rise is not None and chunk_s is not None and rise <= chunk_s}


async def victim_and_model(args: argparse.Namespace) -> tuple[dict[str, str], Any, list[Any], Any, Any]:
    """What a victim-beside-another benchmark (hog, hostile) loads once: the model's placement, the workload,
    the victim's Zipf-drawn requests, the model and its tokenizer (this process serving single-threaded)."""
    where = placement(args)
    serve_single_threaded()
    wl = load_workload(args.corpus, args.questions, args.pool, False)
    seq = [wl.pool[i] for i in draw_sequence(len(wl.pool), args.requests, args.zipf, args.seed)]
    model, tok = await asyncio.to_thread(load_model, args.model, **where)
    return where, wl, seq, model, tok


async def victim_stack(args: argparse.Namespace, root: Path, wl: Any) -> StackConfig:
    """The stacks' shared settings under ``root``, the corpus embedded once into their vector cache."""
    stack = StackConfig(root, args.model, args.max_new_tokens, args.concurrency, args.threads, args.deadline_s,
                        generator=check_generator_overrides(args.gen))
    await asyncio.to_thread(build_vector_cache, stack, wl.docs)
    return stack


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    where, wl, seq, model, tok = await victim_and_model(args)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hog-") as root:
        # the engine keeps the server's capacity (16 running, 64 waiting): the hog's streams queue as on a server
        stack = await victim_stack(args, Path(root), wl)
        for way in WAYS:
            runs[way] = await one_way(args, stack, way, model, tok, wl, seq)
    return {"kind": "hog", "model": args.model, "device": where["device"], "dtype": args.dtype,
            "threads": args.threads or usable_cores(), "machine": machine(), "cpu": cpu_name(),
            "dataset": args.dataset, "requests": args.requests, "concurrency": args.concurrency,
            "max_new_tokens": args.max_new_tokens, "hog_streams": args.hog_streams, "hog_max_new": args.hog_max_new,
            "generator": stack.generator, "runs": runs, "targets": targets(runs)}


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (bench/hog_args.py parses them without torch)."""
    data = asyncio.run(_run(args))
    rows = [{"way": w, **r, "errs": ",".join(f"{k}:{v}" for k, v in r["errors"].items()) or "-",
             "hog_calls": ",".join(f"{k}:{v}" for k, v in r["hog_outcomes"].items()) or "-"}
            for w, r in data["runs"].items()]
    print(f"\n{ran_on(data)}, victim: {data['requests']} requests x {data['concurrency']} clients; hog: "
          f"{data['hog_streams']} streams of {data['runs']['hog']['hog_prompt_tokens']}-token prompts")
    print_table(rows, COLUMNS)
    t = data["targets"]
    print(f"prefix hits kept {t['prefix_hits_kept']} (target >= {1 - HITS_DROP_TARGET:.2f}); TTFT p50 rise "
          f"{t['ttft_p50_rise_s']} s = {t['ttft_p50_rise_chunks']} prefill chunks (target <= 1)")
    write_outputs(args, data, plot)
    return 0


def write_outputs(args: argparse.Namespace, data: dict[str, Any], draw: Callable[[dict[str, Any], str], None]) -> None:
    """The JSON at --json and the PNG ``draw`` makes at --png (default: beside the JSON)."""
    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    png = args.png or (str(args.json).removesuffix(".json") + ".png" if args.json else "")
    if png:
        draw(data, png)
        print(f"wrote {png}")
