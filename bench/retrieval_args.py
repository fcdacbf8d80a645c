"""Retrieval latency: p50/p99 of embedding a question + searching a flat index of >= 10k chunks.

    lookahead-rag-bench retrieval [--corpus C.jsonl --questions Q.jsonl] [--chunks 10000] [--json out.json]

The index holds the bundled stdlib corpus plus the benchmark corpus (the small bundled set of
bench/data unless --corpus/--questions name yours), and is filled up to
``--chunks`` with variants of those chunks: a variant's vector is its source chunk's vector plus
gaussian noise, renormalized (``--noise``), so the filler needs no minutes of encoding. A flat
index's search cost is n x dim multiply-adds whatever the vectors hold, so the latency is that of
the same number of real chunks. Every chunk goes through the normal ingest path (chunking, index,
id map); only their vectors come from a VectorCache. The questions timed are the stdlib sample
questions and the benchmark questions (answerable or not), ``--repeats`` times over. ``measure_retrieval`` is what
``lookahead-rag-bench decoding`` reports as ``"retrieval"``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lookahead_rag.bench.dataset import Dataset, add_dataset_args, dataset_from_args

DEFAULT_CHUNKS = 10_000  # the target: p50 < 20 ms over 10k chunks (flat)
DEFAULT_K = 4
DEFAULT_REPEATS = 20  # passes over the question list
DEFAULT_NOISE = 0.3  # filler vector = normalize(v + noise * N(0, I) / sqrt(dim))


def parse(argv: list[str]) -> tuple[argparse.Namespace, Dataset]:
    """The flags and the dataset they name (the bundled set unless --corpus/--questions)."""
    parser = argparse.ArgumentParser(prog="lookahead-rag-bench retrieval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS, help="index size to reach")
    add_dataset_args(parser)
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="chunks per search")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="passes over the questions")
    parser.add_argument("--noise", type=float, default=DEFAULT_NOISE, help="variant vectors' noise level")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads, as a standalone retriever runs (0: torch's default)"
    )
    parser.add_argument("--json", type=Path, help="write the results here as well")
    parser.add_argument("--png", type=Path, help="plot here (default: next to --json)")
    args = parser.parse_args(argv)
    return args, dataset_from_args(parser, args)


def main(argv: list[str] | None = None) -> int:
    args, dataset = parse(argv or [])
    from lookahead_rag.bench.retrieval import run  # torch (the retriever): loads once the arguments are parsed

    return run(args, dataset)
