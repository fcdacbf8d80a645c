"""Fetch latency of one tenant with many stored outputs (a quick measurement, not a test).

    python -m lookahead_rag.services.draftcache.latency [--outputs 1000] [--queries 200] [--budget 0]

Token streams come from the bundled corpus with a word-level tokenizer (no model needed): stored
outputs are spans of documents (answers copy their sources), a request's prompt holds a few
documents and a question, its references one past answer. Prints the median and p90 of
``DraftCacheStore.fetch`` and ``add_output``, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lookahead_rag.services
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore

CORPUS = Path(lookahead_rag.services.__file__).parent / "data" / "stdlib_corpus.jsonl"
WORD = re.compile(r"\w+|[^\w\s]")
TENANT, TOKENIZER = "bench", "words"
OUTPUT_TOKENS = (64, 160)  # stored output length range (tokens)
PROMPT_DOCS = 4  # documents in a prompt
DOC_TOKENS = 300  # each cut to this many tokens
QUESTION_TOKENS = 16  # the question: a short span of one document
P90 = 0.9
T = TypeVar("T")


def tokenized_docs(path: Path) -> list[list[int]]:
    vocab: dict[str, int] = {}
    docs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        words = WORD.findall(json.loads(line)["text"])
        docs.append([vocab.setdefault(w, len(vocab)) for w in words])
    return [d for d in docs if len(d) >= OUTPUT_TOKENS[0]]


def span(rng: random.Random, doc: list[int], length: int) -> list[int]:
    start = rng.randrange(max(1, len(doc) - length))
    return doc[start : start + length]


def timed_ms(fn: Callable[[], T]) -> tuple[T, float, float]:
    """fn's result, its wall time and its CPU time (this thread; less sensitive to a busy machine)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    result = fn()
    return result, (time.perf_counter() - w0) * 1000.0, (time.thread_time() - c0) * 1000.0


def summary(name: str, wall: list[float], cpu: list[float]) -> str:
    ordered = sorted(wall)
    p90 = ordered[int(P90 * (len(ordered) - 1))]
    return (
        f"{name:<12} n={len(wall):<5} median={statistics.median(wall):7.2f} ms (cpu {statistics.median(cpu):6.2f})"
        f"  p90={p90:7.2f} ms  max={ordered[-1]:7.2f} ms  total={sum(wall) / 1000:6.2f} s (cpu {sum(cpu) / 1000:.2f})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=1000, help="stored outputs of the tenant")
    parser.add_argument("--queries", type=int, default=200, help="fetches measured")
    parser.add_argument("--budget", type=int, default=0, help="fetch budget (0: the default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    docs = tokenized_docs(CORPUS)
    store = DraftCacheStore(DraftCacheSettings(data_dir=None))
    outputs: list[list[int]] = []
    add_ms: tuple[list[float], list[float]] = ([], [])
    for i in range(args.outputs):
        out = span(rng, rng.choice(docs), rng.randint(*OUTPUT_TOKENS))
        outputs.append(out)
        _, wall, cpu = timed_ms(lambda out=out, i=i: store.add_output(TENANT, TOKENIZER, out, f"e{i}"))
        add_ms[0].append(wall)
        add_ms[1].append(cpu)
    fetch_ms: tuple[list[float], list[float]] = ([], [])
    tokens = []
    for _ in range(args.queries):
        chosen = rng.sample(docs, PROMPT_DOCS)
        prompt = [t for d in chosen for t in d[:DOC_TOKENS]] + span(rng, chosen[0], QUESTION_TOKENS)
        refs = rng.choice(outputs)
        continuations, wall, cpu = timed_ms(lambda p=prompt, r=refs: store.fetch(TENANT, TOKENIZER, p, r, args.budget))
        fetch_ms[0].append(wall)
        fetch_ms[1].append(cpu)
        tokens.append(sum(len(b.ids) for b in continuations))
    stats = store.stats(TENANT)[0]
    print(f"tenant: {stats.outputs} outputs, {stats.references} kept whole, {stats.nodes} trie nodes")
    print(f"prompt ~{PROMPT_DOCS * DOC_TOKENS + QUESTION_TOKENS} tokens + {OUTPUT_TOKENS} reference tokens")
    print(summary("add_output", *add_ms))
    print(summary("fetch", *fetch_ms), f"  tokens returned (median)={statistics.median(tokens):.0f}")


if __name__ == "__main__":
    main()
