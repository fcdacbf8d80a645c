"""Answer quality end to end: what the served path loses between the question's paragraph and the prompt.

    lookahead-rag-bench quality [--corpus C.jsonl --questions Q.jsonl] [--limit 40] [--unanswerable 10] \\
        [--max-new-tokens 32] [--ks 3] [--past 0 --past-rounds 2] [--system-prompt TEXT] \\
        [--hybrid off,on] [--min-score-ratio 0.8] [--distractors D.jsonl] [--recall-only] \\
        [--model NAME] [--threads N] [--json out.json] [--png out.png]

On the first ``--limit`` answerable questions (file order) and the first ``--unanswerable`` ones the file
marks ``"answerable": false``, with the retriever set up as bench serve sets it up (one tenant, or one per
article with --tenants-by-title):

- retrieval: recall@1/3/5/10 of the question's own paragraph (any chunk of its ``doc_id``) in the
  retriever's search, and the share of served prompts that hold it, for each search of ``--hybrid``
  (off: FAISS alone, on: FAISS + BM25 fused by reciprocal rank; default: [retriever] hybrid), over the
  corpus alone or with ``--distractors`` (a JSONL corpus added to every tenant: bench/distractors.py
  writes one of real text), at a fixed k and with each adaptive-k ratio of ``--min-score-ratio``
  ([retriever] passage_min_score_ratio: the passages kept while near the best score, and how many);
  ``--recall-only`` stops there (no model is loaded, no answer generated);
- answers (plain greedy, transformers' generate, at most --max-new-tokens): SQuAD EM / F1 of the
  answerable questions prompted with their own paragraph alone ("gold") and with the served prompt
  (retrieved passages by each search of --hybrid, each passage order of --orders, at each k of --ks);
  answers that wrongly
  say the documents do not hold it; on the unanswerable ones, the share that say so (abstained) and
  the share answered anyway;
- past answers (``--past N``: the first N answerable questions asked ``--past-rounds`` times in a row
  through the engine, hierarchical drafting, each answer fed back as the product feeds it): EM / F1,
  tokens per step and tok/s with past answers in the prompt (``[retriever] past_answers_in_prompt``),
  as drafts only (the request trie keeps every past output: the draft cache's role) and not at all.
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import add_model_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args

DEFAULT_LIMIT = 40  # the bundled set's benchmarked questions
DEFAULT_MAX_NEW_TOKENS = 32  # SQuAD answers are a few words; a grounded reply rarely needs more
DEFAULT_UNANSWERABLE = 10
SEARCHES = {"off": "dense", "on": "hybrid"}  # --hybrid value -> the search's name in the results
ORDER_NAMES = ("canonical", "score", "score_last")  # [retriever] passage_order values --orders takes
DEFAULT_PAST_ROUNDS = 2  # the demo's shape: the same questions again once their answers are remembered


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench quality", __doc__)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="the first N answerable questions")
    p.add_argument("--unanswerable", type=int, default=DEFAULT_UNANSWERABLE,
                   help="the first N unanswerable questions (abstained / answered anyway)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="greedy answer length cap")
    p.add_argument("--ks", default="", help="passages retrieved, comma-separated (default: [limits] default_k)")
    p.add_argument("--past", type=int, default=0, help="past-answer study: the first N answerable questions (0: off)")
    p.add_argument("--past-rounds", type=int, default=DEFAULT_PAST_ROUNDS, help="times the past-answer questions "
                   "are asked in a row")
    p.add_argument("--system-prompt", default=None, help="the retriever's system prompt for this run")
    p.add_argument("--hybrid", default="", help="searches compared, comma-separated: off (FAISS), on (+ BM25); "
                   "default: [retriever] hybrid")
    p.add_argument("--min-score-ratio", default="", help="adaptive-k ratios compared with the fixed k "
                   "(retrieval and answers), comma-separated ([retriever] passage_min_score_ratio)")
    p.add_argument("--distractors", default="", help="JSONL documents added to every tenant (bench/distractors.py)")
    p.add_argument("--orders", default=",".join(ORDER_NAMES), help="passage orders answered with, "
                   f"comma-separated ({', '.join(ORDER_NAMES)}); each costs one answer per question")
    p.add_argument("--recall-only", action="store_true", help="retrieval figures only: no model, no answers")
    add_model_args(p)
    args = p.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1 or args.unanswerable < 0 or args.past < 0 or args.past_rounds < 1:
        p.error("--limit, --max-new-tokens and --past-rounds must be positive, --unanswerable and --past not negative")
    try:
        args.ks = [int(k) for k in args.ks.split(",") if k.strip()]
    except ValueError:
        p.error("--ks: comma-separated integers")
    args.hybrid = [v.strip() for v in args.hybrid.split(",") if v.strip()]
    try:
        args.min_score_ratio = [float(r) for r in args.min_score_ratio.split(",") if r.strip()]
    except ValueError:
        p.error("--min-score-ratio: comma-separated numbers")
    if any(not 0 <= r <= 1 for r in args.min_score_ratio):
        p.error("--min-score-ratio: each within [0, 1]")
    args.orders = [v.strip() for v in args.orders.split(",") if v.strip()]
    if not args.orders or set(args.orders) - set(ORDER_NAMES):
        p.error(f"--orders: comma-separated, of {', '.join(ORDER_NAMES)}")
    if set(args.hybrid) - set(SEARCHES):
        p.error(f"--hybrid: comma-separated {' and '.join(SEARCHES)}")
    args.dataset = dataset_from_args(p, args).name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.answer_quality import report  # torch: loaded once the arguments are parsed

    return report(args)
