"""The draft-agreement benchmark (what it measures and its command line: bench/draft_agreement_args.py)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
from lookahead_core.kv.draft_kv import rollback_cache
from lookahead_core.models import load_model
from lookahead_core.proposers.draft_model import early_exit
from tqdm import tqdm
from transformers import DynamicCache

from lookahead_rag.bench import common
from lookahead_rag.bench.common import answerable, grounded_prompt_ids, placement, print_table, read_jsonl, write_json
from lookahead_rag.bench.plot import plot_result

TIMED_FORWARDS = 9  # one-token forwards timed per model (the median is kept)


def one_token_ms(model: torch.nn.Module, prompt: list[int]) -> float:
    """Median ms of a one-token forward after ``prompt`` is cached."""
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
        times = []
        for _ in range(TIMED_FORWARDS):
            t0 = time.perf_counter()
            model(input_ids=torch.tensor([[prompt[-1]]]), cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            rollback_cache(cache, len(prompt))
    return statistics.median(times) * 1000.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, **placement(args))
    total_layers = int(model.config.num_hidden_layers)
    layers = [n for n in args.layers if 1 <= n < total_layers]
    corpus = {row["id"]: row for row in read_jsonl(args.corpus)}
    questions = answerable(read_jsonl(args.questions))[args.skip : args.skip + args.limit]
    agree = dict.fromkeys(layers, 0)
    tokens = 0
    prompt: list[int] = []
    for q in tqdm(questions, desc="answers and early exits"):
        prompt = grounded_prompt_ids(tok, [corpus[q["doc_id"]]], q["question"])
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=args.max_new_tokens, do_sample=False)[0]  # [prompt + answer]
            hidden = model(input_ids=out[None], output_hidden_states=True).hidden_states  # layers + 1 x [1, T, d]
        rows = slice(len(prompt) - 1, len(out) - 1)  # the rows that predict each answer token
        target = out[len(prompt):]  # [answer]
        tokens += target.numel()
        with torch.inference_mode():
            for n in layers:
                logits = model.lm_head(model.model.norm(hidden[n][0, rows]))  # [answer, vocab]
                agree[n] += int((logits.argmax(-1) == target).sum())
    target_ms = one_token_ms(model, prompt)
    rows_out = []
    for n in layers:
        ms = one_token_ms(early_exit(model, n), prompt)
        rows_out.append({"layers": n, "agreement": round(agree[n] / max(tokens, 1), 4),
                         "draft_ms": round(ms, 2), "cost_vs_target": round(ms / target_ms, 3)})
    print_table(rows_out, [("layers", "exit layer", "d"), ("agreement", "top-1 agreement", ".3f"),
                           ("draft_ms", "1-token ms", ".1f"), ("cost_vs_target", "x target", ".2f")])
    print(f"target: {total_layers} layers, {target_ms:.1f} ms a one-token forward; {tokens} answer tokens of "
          f"{len(questions)} questions")
    return {
        "kind": "draft_agreement", "model": args.model, "dataset": args.dataset, "machine": common.machine(),
        "cpu": common.cpu_name(), "threads": torch.get_num_threads(), "questions": len(questions), "tokens": tokens,
        "target_layers": total_layers, "target_ms": round(target_ms, 2), "exits": rows_out,
    }


def report(args: argparse.Namespace) -> int:
    """Run, and write the JSON and its PNG when ``--json`` is given."""
    data = run(args)
    if args.json:
        write_json(args.json, data)
        png = str(args.json).removesuffix(".json") + ".png"
        plot_result(data, png)
        print(f"wrote {args.json} and {png}")
    return 0


if __name__ == "__main__":
    from lookahead_rag.bench.draft_agreement_args import main

    raise SystemExit(main(sys.argv[1:]))
