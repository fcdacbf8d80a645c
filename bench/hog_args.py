"""``lookahead-rag-bench hog``: one tenant doing the worst it may, another tenant's requests beside it.

    lookahead-rag-bench hog [--corpus C.jsonl --questions Q.jsonl] [--requests 24] [--concurrency 2] \\
        [--hog-streams 32] [--hog-prompt-tokens 0] [--hog-max-new 4] [--max-new-tokens 64] [--json out.json]

Two runs on fresh stacks (cold caches), the same victim requests in both, in one process: ``plain`` (the
victim alone: the baseline) and ``hog`` (beside it, tenant ``hog`` keeps ``--hog-streams`` Generate calls in
flight back to back, each a new prompt of random ids as long as it may be: the most its share of the prefix
cache holds, within its share of request KV and the model's context; so every call is a long prefill and a
candidate to flush the prefix cache). The victim is tenant ``bench``: Zipf-drawn questions over the corpus
through ``Answer``, as ``bench serve`` sends them (their prompts share the system prompt and documents: the
prefix cache's worth to it). Per run: the victim's goodput, TTFT p50/p99, prefix-hit tokens and tokens per
step; the hog's calls by outcome. Issue 46's targets: the victim's prefix hits fall by at most 10% and its
TTFT p50 rises by at most one prefill chunk's forward (the engine's measured cost of ``prefill_chunk``
tokens). A table, the JSON (``"kind": "hog"``) and a PNG (bench/hog_plot.py).
"""

from __future__ import annotations

import argparse

from lookahead_rag.bench.common import add_draw_args, add_placement_args, workload_parser
from lookahead_rag.bench.dataset import dataset_from_args


def victim_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of a victim-beside-another benchmark (hog, hostile), with the victim's load: its workload, its
    Zipf-drawn requests, its clients and the tokens each request asks for."""
    p = workload_parser(prog, doc)
    add_draw_args(p, 24, "the victim's requests per run")
    p.add_argument("--concurrency", type=int, default=2, help="the victim's closed-loop clients")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens each victim request asks for")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    p = victim_parser("lookahead-rag-bench hog", __doc__)
    p.add_argument("--hog-streams", type=int, default=32, help="calls the hog keeps in flight (its stream limit)")
    p.add_argument("--hog-prompt-tokens", type=int, default=0,
                   help="tokens of each hog prompt (0: the most it may, see above)")
    p.add_argument("--hog-max-new", type=int, default=4, help="tokens each hog call asks for")
    return parse_stack_args(p, argv)


def parse_stack_args(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments every victim-beside-another benchmark (hog, hostile) ends with: the model, where it runs,
    the engine's threads, the victim's deadline, [generator] settings and the outputs; then ``argv`` parsed."""
    p.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, local path or hub id")
    add_placement_args(p)
    p.add_argument("--threads", type=int, default=0, help="torch threads of the engine (0: every core)")
    p.add_argument("--deadline-s", type=float, default=600.0, help="gRPC deadline of one request")
    p.add_argument("--gen", action="append", default=[], metavar="KEY=VALUE", help="a [generator] setting")
    p.add_argument("--json", default="", help="write the result here (and the PNG beside it)")
    p.add_argument("--png", default="", help="the PNG (default: beside --json)")
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv or [])  # --help exits here, before torch is imported
    from lookahead_rag.bench.hog import run  # torch: only once the benchmark runs

    return run(args)
