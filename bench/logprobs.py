"""The logprobs benchmark (what it measures and its command line: bench/logprobs_args.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lookahead_core import DecodingConfig
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.models import load_model
from lookahead_core.sampling.logprobs import TokenLogprob, token_logprobs
from tqdm import tqdm

from lookahead_rag.bench.common import placement, print_table, ran_on, run_header
from lookahead_rag.bench.engine_runner import SchedulerRunner
from lookahead_rag.bench.exactness import closed_loop
from lookahead_rag.bench.logprobs_compare import DIGITS, compare_logprobs, equal_answers
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.prompt_order import build_prompts, retriever_cores
from lookahead_rag.bench.serve_load import Workload, load_workload
from lookahead_rag.bench.ties import TIE_LOGIT_GAP
from lookahead_rag.services.retriever.prompt import PassageOrder

BASELINE = "hf_greedy_logits"  # transformers' generate(do_sample=False, output_logits=True), batch 1
ORDER = PassageOrder.CANONICAL  # the served passage order
PREFIX_CACHE = "fresh per pass"  # every pass: its own engine, the served prefix cache, empty at the start


@dataclass
class EnginePass:
    """One pass of every prompt through a fresh engine, logprobs off or on."""

    concurrency: int
    logprobs: bool
    outputs: list[list[int]]
    token_logprobs: list[list[TokenLogprob]]  # empty lists when off
    wall_s: float

    @property
    def name(self) -> str:
        return f"c{self.concurrency} {'on' if self.logprobs else 'off'}"

    @property
    def new_tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.wall_s if self.wall_s else None


def setup(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]]]:
    """torch's threads (``--threads``; 0: torch's default), the model, its tokenizer and every prompt."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, **placement(args))
    wl = load_workload(args.corpus, args.questions, args.limit, args.tenants_by_title)
    return model, tok, canonical_prompts(args, wl, tok)


def canonical_prompts(args: argparse.Namespace, wl: Workload, tok: Any) -> list[list[int]]:
    """Every question's prompt from the retriever, as bench exactness builds them (canonical order)."""
    with tempfile.TemporaryDirectory(prefix="bench-logprobs-") as root:
        cores = retriever_cores(Path(root), args, wl, tok, (ORDER,))
        try:
            return build_prompts(cores, wl.pool, args.max_new_tokens)[ORDER].prompts
        finally:
            for core in cores.values():
                core.close()


def baseline_logprobs(model: Any, prompt_ids: Sequence[int], max_new: int, top: int) -> list[TokenLogprob]:
    """Batch-1 greedy ``generate`` with its raw logits kept: each new token's logprob and the top ``top``."""
    x = torch.tensor([list(prompt_ids)], device=model.device)  # [1, prompt]
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                             output_logits=True, return_dict_in_generate=True)
        tokens = out.sequences[0, x.shape[1]:].tolist()
        logits = torch.cat(out.logits)  # one [1, vocab] per new token -> [new, vocab], before any processor
        return token_logprobs(logits, tokens, top)


def engine_pass(args: argparse.Namespace, model: Any, tok: Any, prompts: list[list[int]], concurrency: int,
                logprobs: bool) -> EnginePass:
    """Every prompt through a fresh engine at ``concurrency``; timed from the first submit to the last answer."""
    config = DecodingConfig(max_new_tokens=args.max_new_tokens, mode=args.mode, logprobs=logprobs,
                            top_logprobs=args.top if logprobs else 0)
    runner = SchedulerRunner(model, tok, config, None, SchedulerConfig(max_running=concurrency,
                                                                       calibrate=args.calibrate))
    try:
        t0 = time.perf_counter()
        reqs = closed_loop(runner, prompts, concurrency, f"engine c{concurrency} logprobs {logprobs}")
        wall = time.perf_counter() - t0
    finally:
        runner.close()
    return EnginePass(concurrency, logprobs, [list(r.output) for r in reqs], [list(r.logprobs) for r in reqs], wall)


def pass_record(p: EnginePass, off: EnginePass | None, refs: list[list[TokenLogprob]]) -> dict[str, Any]:
    """A pass's row in the JSON: speed, equal answers and (ON) the logprob comparison and the ON/OFF ratio."""
    ref_ids = [[t.token_id for t in r] for r in refs]
    row: dict[str, Any] = {
        "name": p.name, "concurrency": p.concurrency, "logprobs": p.logprobs, "answers": len(p.outputs),
        "new_tokens": p.new_tokens, "wall_s": round(p.wall_s, 2),
        "tokens_per_s": round(p.tokens_per_s, 2) if p.tokens_per_s else None,
        "equal_to_baseline": equal_answers(p.outputs, ref_ids),
    }
    if off is not None:
        ratio = p.tokens_per_s / off.tokens_per_s if p.tokens_per_s and off.tokens_per_s else None
        row |= {"equal_to_off": equal_answers(p.outputs, off.outputs),
                "on_off_ratio": round(ratio, DIGITS) if ratio else None}
        row |= compare_logprobs(p.outputs, p.token_logprobs, refs).record()
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    model, tok, prompts = setup(args)
    t0 = time.perf_counter()
    refs = [baseline_logprobs(model, ids, args.max_new_tokens, args.top)
            for ids in tqdm(prompts, desc=f"baseline {BASELINE}")]
    baseline_wall = time.perf_counter() - t0
    records = []
    for c in args.concurrency:  # OFF then ON at each level, one after the other
        off = engine_pass(args, model, tok, prompts, c, logprobs=False)
        on = engine_pass(args, model, tok, prompts, c, logprobs=True)
        records += [pass_record(off, None, refs), pass_record(on, off, refs)]
    return {
        "kind": "logprobs",  # what `lookahead-rag-bench plot` draws
        **run_header(args),
        "prompts": len(prompts), "limit": args.limit, "max_new_tokens": args.max_new_tokens, "mode": args.mode,
        "top_logprobs": args.top, "concurrency": args.concurrency, "prefix_cache": PREFIX_CACHE,
        "baseline": BASELINE, "calibrated": args.calibrate, "tie_gap": TIE_LOGIT_GAP,
        "mean_prompt_tokens": round(sum(map(len, prompts)) / max(len(prompts), 1), 1),
        "baseline_new_tokens": sum(map(len, refs)), "baseline_wall_s": round(baseline_wall, 2),
        "all_equal": all(r["equal_to_baseline"] == len(prompts) for r in records),
        "passes": records,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }


COLUMNS = [
    ("name", "pass", "s"), ("concurrency", "clients", "d"), ("answers", "answers", "d"),
    ("equal_to_baseline", "= baseline", "d"), ("equal_to_off", "= off", "d"), ("new_tokens", "tokens", "d"),
    ("wall_s", "wall s", ".2f"), ("tokens_per_s", "tok/s", ".2f"), ("on_off_ratio", "on/off", ".3f"),
    ("max_abs_logprob_diff", "max |dlogprob|", ".2e"), ("top_same_frac", "top-N same", ".4f"),
    ("top_ties", "top-N ties", "d"), ("max_abs_top_diff", "max |dtop|", ".2e"),
]


def summary(data: dict[str, Any]) -> list[str]:
    """What the table does not say: the run's setting, each pass that failed a check, and the verdict."""
    lines = [f"{ran_on(data)}, {data['prompts']} prompts, {data['max_new_tokens']} new tokens, mode {data['mode']}, "
             f"top {data['top_logprobs']}; baseline {data['baseline']} ({data['baseline_wall_s']} s); prefix cache "
             f"{data['prefix_cache']}"]
    for p in data["passes"]:
        if p["equal_to_baseline"] != p["answers"]:
            lines.append(f"MISMATCH {p['name']}: {p['answers'] - p['equal_to_baseline']} answer(s) differ "
                         "from the baseline")
        if p.get("logprob_count_errors"):
            lines.append(f"COUNT {p['name']}: {p['logprob_count_errors']} answer(s) without one logprob per token")
    lines.append(f"all answers equal to the baseline: {data['all_equal']}; wall {data['wall_s']} s")
    return lines


def report(args: argparse.Namespace) -> int:
    """Run, print the table and the summary, and write the JSON and its PNG when asked."""
    data = run(args)
    print_table(data["passes"], COLUMNS)
    print("\n".join(summary(data)))
    write_outputs(data, args.json, args.png)
    return 0


if __name__ == "__main__":
    from lookahead_rag.bench.logprobs_args import main

    raise SystemExit(main(sys.argv[1:]))
