"""Retrieval latency, measured (what it measures and its command line: bench/retrieval_args.py)."""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lookahead_rag.bench.common import cpu_name, machine, print_table, read_jsonl, write_json
from lookahead_rag.bench.dataset import Dataset, Source
from lookahead_rag.bench.plot import default_png, plot_result
from lookahead_rag.bench.retrieval_args import DEFAULT_CHUNKS, parse
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.corpus import bundled_corpus_path, sample_questions_path
from lookahead_rag.services.retriever.documents import ChunkRecord, Document, make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.settings import IndexKind, RetrieverSettings
from lookahead_rag.services.retriever.vector_cache import CachingEncoder, VectorCache, with_cache

TENANT = "bench"
WARMUP_QUERIES = 5  # first calls pay lazy initialisation; not timed
SEED = 0
P50, P99 = 50, 99
MS_PER_S = 1000.0
VARIANT_SUFFIX = " (variant {n})"


def measure_retrieval(core: RetrieverCore, tenant: str, questions: Sequence[str], k: int) -> dict[str, Any]:
    """Wall time of ``core.search`` (question embedding + FAISS) per question: chunks, p50_ms, p99_ms."""
    for question in list(questions)[:WARMUP_QUERIES]:
        core.search(tenant, question, k)
    times_ms: list[float] = []
    for question in questions:
        start = time.perf_counter()
        core.search(tenant, question, k)
        times_ms.append((time.perf_counter() - start) * MS_PER_S)
    return {"chunks": core.stats(tenant).chunks, **_percentiles(times_ms)}


def measure_search_cpu(core: RetrieverCore, tenant: str, questions: Sequence[str], k: int) -> dict[str, float]:
    """Process CPU time per search (all threads): what a search costs when it has the cores to itself.

    Wall time on a shared machine includes waiting for cores other processes hold; with one torch
    thread the CPU time is close to the wall time the same search takes on an idle machine.
    """
    times_ms: list[float] = []
    for question in questions:
        start = time.process_time()
        core.search(tenant, question, k)
        times_ms.append((time.process_time() - start) * MS_PER_S)
    return _percentiles(times_ms)


def _percentiles(times_ms: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(times_ms, P50)), 3),
        "p99_ms": round(float(np.percentile(times_ms, P99)), 3),
    }


def measure_embedding(core: RetrieverCore, questions: Sequence[str]) -> dict[str, float]:
    """The question-embedding part alone (the rest of a search is FAISS)."""
    times_ms: list[float] = []
    for question in questions:
        start = time.perf_counter()
        core.embedder.encode_one(question)
        times_ms.append((time.perf_counter() - start) * MS_PER_S)
    return _percentiles(times_ms)


def measure_retrieve_with_prompt(
    core: RetrieverCore, tenant: str, questions: Sequence[str], k: int
) -> dict[str, float]:
    """The whole Retrieve (search + past sessions + prompt assembly and tokenization), in-process."""
    times_ms: list[float] = []
    for question in questions:
        start = time.perf_counter()
        core.retrieve(tenant, question, k=k)
        times_ms.append((time.perf_counter() - start) * MS_PER_S)
    return _percentiles(times_ms)


def variants(
    chunks: Sequence[ChunkRecord], vectors: np.ndarray, count: int, settings: RetrieverSettings, noise: float
) -> tuple[list[Document], list[str], np.ndarray]:
    """``count`` one-chunk documents cycling over ``chunks``, with their embedding texts and noisy vectors."""
    rng = np.random.default_rng(SEED)
    docs: list[Document] = []
    texts: list[str] = []
    rows: list[int] = []
    for n in range(count):
        row = n % len(chunks)
        base = chunks[row]
        suffix = VARIANT_SUFFIX.format(n=n)
        text = base.text[: settings.chunk_chars - len(suffix)] + suffix  # fits one chunk
        doc = Document(f"variant-{n}-{base.chunk_id}", base.title, text, base.source)
        made = make_chunks(doc, settings.chunk_chars, settings.chunk_overlap)
        docs.append(doc)
        texts += [c.embedding_text() for c in made]
        rows += [row] * len(made)
    base_vectors = vectors[rows]  # [m, dim]
    jitter = rng.standard_normal(base_vectors.shape).astype(np.float32) * (noise / np.sqrt(vectors.shape[1]))
    noisy = base_vectors + jitter
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return docs, texts, noisy


def documents(path: str | Path | Source) -> list[Document]:
    """The rows of a corpus JSONL file ({id, title, text[, source]}) as documents."""
    return [Document(r["id"], r.get("title", ""), r["text"], r.get("source", "")) for r in read_jsonl(path)]


def build_core(
    target_chunks: int, corpus: Source | None, noise: float, settings: RetrieverSettings
) -> tuple[RetrieverCore, dict[str, int]]:
    """A core whose tenant TENANT holds >= target_chunks chunks (real first, then variants)."""
    embedder = Embedder(settings.embedder_path, batch_size=settings.embed_batch_size)
    docs = documents(bundled_corpus_path())
    if corpus is not None:
        docs += documents(corpus)
    chunks = [c for d in docs for c in make_chunks(d, settings.chunk_chars, settings.chunk_overlap)]
    texts = [c.embedding_text() for c in chunks]
    vectors = with_cache(embedder, settings.vector_cache, embedder.name).encode(texts)  # [n, dim]
    fill = max(0, target_chunks - len(texts))
    extra_docs, extra_texts, extra_vectors = variants(chunks, vectors, fill, settings, noise)
    cache = VectorCache.build(embedder.name, [*texts, *extra_texts], np.concatenate([vectors, extra_vectors]))
    core = RetrieverCore(settings, embedder=CachingEncoder(embedder, cache))
    core.ingest(TENANT, [*docs, *extra_docs])
    return core, {"real_chunks": len(texts), "variant_chunks": len(extra_texts)}


def questions_for(path: Source | None) -> list[str]:
    """The stdlib sample questions, then those of ``path`` (every one: latency does not need answers)."""
    questions = [q["question"] for q in read_jsonl(sample_questions_path())]
    if path is not None:
        questions += [q["question"] for q in read_jsonl(path)]
    return questions


def main(argv: list[str] | None = None) -> int:
    return run(*parse(argv or []))


def run(args: argparse.Namespace, dataset: Dataset) -> int:
    """The benchmark for parsed arguments (bench.retrieval_args.main parses them without torch)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    settings = RetrieverSettings(data_dir=None, index_kind=IndexKind.FLAT, torch_threads=args.threads)
    start = time.perf_counter()
    core, sizes = build_core(args.chunks, dataset.corpus, args.noise, settings)
    build_s = time.perf_counter() - start
    base_questions = questions_for(dataset.questions)
    questions = base_questions * args.repeats if len(base_questions) < DEFAULT_CHUNKS else base_questions
    search = measure_retrieval(core, TENANT, questions, args.k)
    cpu = measure_search_cpu(core, TENANT, questions, args.k)
    embed = measure_embedding(core, questions)
    full = measure_retrieve_with_prompt(core, TENANT, questions, args.k)

    def row(what: str, stats: dict[str, Any]) -> dict[str, Any]:
        return {"what": what, "chunks": search["chunks"], "queries": len(questions), **stats}

    rows = [
        row("search (embed + flat FAISS), wall", search),
        row("search, process CPU time", cpu),
        row("  question embedding alone, wall", embed),
        row("Retrieve incl. prompt, wall", full),
    ]
    print_table(
        rows,
        [
            ("what", "measure", "s"),
            ("chunks", "chunks", "d"),
            ("queries", "queries", "d"),
            ("p50_ms", "p50 ms", ".2f"),
            ("p99_ms", "p99 ms", ".2f"),
        ],
    )
    result = {
        "kind": "retrieval",  # what `lookahead-rag-bench plot` draws
        "embedder": settings.embedder_path.name,
        "cpu": cpu_name(),
        "host": machine(),
        "dataset": f"stdlib corpus + {dataset.name}",
        "retrieval": search,
        "search_cpu": cpu,
        "embedding": embed,
        "retrieve_with_prompt": full,
        "index": {"kind": settings.index_kind.value, **sizes, "build_s": round(build_s, 2), "k": args.k},
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
    }
    print(result)
    if args.json is not None:
        write_json(args.json, result)
    png = args.png or (default_png(args.json) if args.json is not None else None)
    if png is not None:
        plot_result(result, png)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
