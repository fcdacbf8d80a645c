"""Prompt order: what canonical passage order buys in prefix-cache hits, and what it does to answers.

    lookahead-rag-bench prompt-order [--corpus C.jsonl --questions Q.jsonl] [--limit 40] \\
        [--max-new-tokens 64] [--tenants-by-title] [--model NAME] [--threads N] [--json out.json] [--png out.png]

For the first ``--limit`` answerable questions, in the file's order, the retriever (set up as bench
serve sets it up: one tenant, or one per article title with --tenants-by-title) builds each prompt
twice in one process: kept passages shown in canonical order (by document and chunk, the default) and
by score (``[retriever] passage_order = "score"``). Which passages are kept is the same both ways.

- Prefix sharing: each prompt's longest common prefix with any earlier prompt of its tenant (what a
  prefix cache that never evicts would reuse; at most the prompt's length minus one), summed, per
  prompt, and as a fraction of all prompt tokens.
- Answer quality: each prompt's plain greedy answer (transformers' generate(do_sample=False), up to
  --max-new-tokens; a prompt identical in both orders is answered once), scored with SQuAD's exact
  match and F1 against the question's "answers" (bench/squad_eval.py).
- Unanswerable questions (``--unanswerable N``: the first N the file marks ``"answerable": false``)
  are asked the same way and reported apart: the share of answers that say the documents do not hold
  the answer (``squad_eval.abstains``), which is what a grounded answer to them should do.
- ``--system-prompt TEXT`` replaces ``[retriever] system_prompt`` for the run (how the default was
  chosen: bench/README.md, "Answer quality").
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import add_model_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args

DEFAULT_LIMIT = 40  # the bundled set's benchmarked questions
DEFAULT_MAX_NEW_TOKENS = 64  # SQuAD answers are short; a grounded reply rarely needs more
DEFAULT_UNANSWERABLE = 10  # unanswerable questions asked after the answerable ones


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench prompt-order", __doc__)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="the first N answerable questions")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="greedy answer length cap")
    add_model_args(p)
    p.add_argument("--unanswerable", type=int, default=DEFAULT_UNANSWERABLE,
                   help="also ask the first N unanswerable questions (reported apart: how many abstain)")
    p.add_argument("--system-prompt", default=None, help="the retriever's system prompt for this run "
                   "(default: [retriever] system_prompt's default)")
    args = p.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1 or args.unanswerable < 0:
        p.error("--limit and --max-new-tokens must be positive, --unanswerable not negative")
    args.dataset = dataset_from_args(p, args).name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.prompt_order import report  # torch: loaded once the arguments are parsed

    return report(args)
