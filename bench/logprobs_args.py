"""Logprobs: what per-token logprobs cost the serving engine, and whether they equal plain decoding's.

    lookahead-rag-bench logprobs [--corpus C.jsonl --questions Q.jsonl] [--limit 40] \\
        [--max-new-tokens 32] [--concurrency 1,16] [--top 5] [--mode hierarchical] \\
        [--model NAME] [--threads N] [--json out.json] [--png out.png]

The first ``--limit`` answerable questions get the retriever's prompts, built as bench exactness
builds them (bench serve's retriever settings, canonical passage order). Each prompt is answered,
in one process:

- by the baseline: transformers' greedy ``generate`` (do_sample=False), batch 1, with the raw
  logits kept (output_logits): at every output position the log_softmax (float32) of those logits
  gives the chosen token's logprob and the top ``--top`` (id, logprob) pairs, through the same
  function the engine uses (lookahead_core.sampling.logprobs.token_logprobs);
- by the engine (the serving StepScheduler, driven by this thread as bench exactness drives it), at
  every ``--concurrency`` (closed loop), twice in a row: logprobs OFF (the cost's baseline), then
  logprobs ON with ``top_logprobs = --top``. Every pass gets a fresh engine (a fresh SchedulerRunner
  with the served prefix cache, empty at the start), so neither pass gets the other's prefix hits.

Reported per pass: wall seconds, generated tokens, tok/s and (ON) the ON/OFF ratio; answers equal
to the baseline's token for token (and, ON, to the OFF pass's). For an ON pass, over the positions
before an answer's first token that differs from the baseline's: the largest |engine logprob -
baseline logprob| of the chosen token, the fraction of positions whose top-N ids are the baseline's
set (order aside; a set that differs only by a swap at a tie with the baseline's N-th value is
counted apart), and the largest |difference| of top-N values over the ids both hold. A table, the
JSON and a PNG.
"""

from __future__ import annotations

import argparse

from lookahead_core.config import MAX_TOP_LOGPROBS  # torch-free: --help stays fast

from lookahead_rag.bench.common import add_model_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args
from lookahead_rag.bench.exactness_args import DEFAULT_CONCURRENCY, DEFAULT_MODE, _csv

DEFAULT_LIMIT = 40
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_TOP = 5  # top_logprobs of the ON passes (OpenAI's top_logprobs)


def levels(text: str) -> list[int]:
    """``--concurrency``: comma-separated integers, each >= 1 (argparse reports a bad value)."""
    try:
        out = [int(c) for c in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: integers, comma-separated") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one level, each >= 1")
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench logprobs", __doc__)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="the first N answerable questions")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="answer length cap")
    p.add_argument("--concurrency", type=levels, default=DEFAULT_CONCURRENCY,
                   help="requests in flight in the engine, comma-separated (each level: an OFF and an ON pass)")
    p.add_argument("--top", type=int, default=DEFAULT_TOP,
                   help=f"top_logprobs of the ON passes and of the baseline, 0..{MAX_TOP_LOGPROBS}")
    p.add_argument("--mode", default=DEFAULT_MODE, help="the engine's draft mode (none: one token a step)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="skip the engine's start-up kernel timing (tests; the served engine measures)")
    add_model_args(p)
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    _check(p, args)
    return args


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The bounds argparse's types do not check (an error exits with the usage)."""
    if args.limit < 1 or args.max_new_tokens < 1:
        p.error("--limit and --max-new-tokens must be positive")
    if not 0 <= args.top <= MAX_TOP_LOGPROBS:
        p.error(f"--top must be in 0..{MAX_TOP_LOGPROBS}, got {args.top}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    from lookahead_rag.bench.logprobs import report  # torch: loaded once the arguments are parsed

    return report(args)
