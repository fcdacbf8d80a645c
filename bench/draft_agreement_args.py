"""Can an early-exit self-draft pay? Its top-1 agreement with the target, and its cost, per exit layer.

    lookahead-rag-bench draft-agreement [--corpus C.jsonl --questions Q.jsonl] [--skip 40] [--limit 6] \\
        [--layers 4,7,10,15,20,25,28] [--max-new-tokens 64] [--model NAME] [--json out.json]

For each question (the answerable ones after ``--skip``: by default not the decoding benchmark's 40) the
target's greedy answer is generated; then, for every exit layer L, the first L decoder layers with the
target's final norm and LM head (``draft_model.early_exit``) predict each answer token from the same
prefix, and agreement is the fraction of answer tokens whose top-1 equals the target's. Cost: the median
time of a one-token forward over the prompt's cache, the draft's against the target's, in this process.

A chain of d draft tokens is worth about a + a^2 + ... + a^d tokens a step (a: agreement) and costs
d x (draft cost) target forwards: the draft pays only where that is well under the tokens it brings.
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import MODEL_HELP, add_placement_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args

DEFAULT_LAYERS = "4,7,10,15,20,25,28"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench draft-agreement", __doc__)
    p.add_argument("--skip", type=int, default=40, help="answerable questions skipped (the decoding benchmark's)")
    p.add_argument("--limit", type=int, default=6, help="answerable questions measured after --skip")
    p.add_argument("--layers", default=DEFAULT_LAYERS, help="comma-separated exit layers")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    add_placement_args(p)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default=None, help="write results here (and a PNG next to it)")
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    args.layers = sorted({int(x) for x in args.layers.split(",") if x.strip()})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.draft_agreement import report  # torch: loaded once the arguments are parsed

    return report(args)
