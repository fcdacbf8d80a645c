"""Exactness: does batching, or a prefix from the cache, ever change a greedy token?

    lookahead-rag-bench exactness [--corpus C.jsonl --questions Q.jsonl] [--limit 300] \\
        [--max-new-tokens 32] [--concurrency 1,16] [--cache off,on,warm] [--mode hierarchical] \\
        [--model NAME] [--threads N] [--json out.json] [--png out.png]

The first ``--limit`` answerable questions get the retriever's prompts, built as bench prompt-order
builds them (bench serve's retriever settings, canonical passage order). Each prompt is answered:

- by the baseline: transformers' greedy ``generate`` (do_sample=False), batch 1, with its scores kept
  (output_scores), so every output position has the baseline's top-1/top-2 score margin;
- by the engine (the serving StepScheduler, driven by this thread through bench/engine_runner.py), at
  every ``--concurrency`` (closed loop: that many requests in flight, a new one as one ends, so each
  forward mixes prefill chunks and other requests' trees), in every ``--cache`` state: ``off`` (no
  prefix cache), ``on`` (a fresh cache, filled as the pass goes: hits where a prompt shares a prefix
  with an earlier one) and ``warm`` (a second pass over the same prompts on that engine: every
  prompt's prefix comes from the cache).

Reported per pass: answers equal to the baseline's, and every mismatch with its first differing
position, the baseline's margin there and the gap between its token and ours (bench/ties.py); for the
baseline: every answer's smallest margin along its greedy path, and how many answers come within
1e-4 / 1e-3 / 1e-2 / 1e-1 of a tie. A table, the JSON and a PNG.
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import add_model_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args

DEFAULT_LIMIT = 300
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_CONCURRENCY = "1,16"
CACHE_STATES = ("off", "on", "warm")  # bench.exactness.CacheState (kept here: --help loads no torch)
DEFAULT_MODE = "hierarchical"  # the served default ([generator] mode)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench exactness", __doc__)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="the first N answerable questions")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="answer length cap")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY,
                   help="requests in flight in the engine, comma-separated (each level is its own passes)")
    p.add_argument("--cache", default=",".join(CACHE_STATES),
                   help="prefix-cache states, comma-separated: off, on (filled as it goes), warm (second pass)")
    p.add_argument("--mode", default=DEFAULT_MODE, help="the engine's draft mode (none: one token a step)")
    p.add_argument("--prefix-cache-mb", type=int, default=0,
                   help="an 'on' engine's prefix cache in MiB (0: room for every prompt, nothing evicted)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="skip the engine's start-up kernel timing (tests; the served engine measures)")
    add_model_args(p)
    args = p.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1 or args.prefix_cache_mb < 0:
        p.error("--limit and --max-new-tokens must be positive, --prefix-cache-mb not negative")
    try:
        args.concurrency = [int(c) for c in _csv(args.concurrency)]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: integers, comma-separated")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency: at least one level, each >= 1")
    args.cache = _csv(args.cache)
    unknown = sorted(set(args.cache) - set(CACHE_STATES))
    if unknown or not args.cache:
        p.error(f"--cache: one or more of {', '.join(CACHE_STATES)} (got {', '.join(unknown) or 'none'})")
    args.dataset = dataset_from_args(p, args).name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.exactness import report  # torch: loaded once the arguments are parsed

    return report(args)
