"""Retrieval latency: p50/p99 of embedding a question + searching a flat index of >= 10k chunks.

    lookahead-rag-bench retrieval [--squad ../shared/data/squad-dev] [--chunks 10000] [--json out.json]

The index holds the bundled stdlib corpus (+ the squad paragraphs if given) and is filled up to
``--chunks`` with variants of those chunks: a variant's vector is its source chunk's vector plus
gaussian noise, renormalized (``--noise``), so the filler needs no minutes of encoding. A flat
index's search cost is n x dim multiply-adds whatever the vectors hold, so the latency is that of
the same number of real chunks. Every chunk goes through the normal ingest path (chunking, index,
id map); only their vectors come from a VectorCache. ``measure_retrieval`` is what
``lookahead-rag-bench decoding`` reports as ``"retrieval"``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import print_table, read_jsonl, write_json
from services.retriever.core import RetrieverCore
from services.retriever.corpus import bundled_corpus_path, sample_questions_path
from services.retriever.documents import ChunkRecord, Document, make_chunks
from services.retriever.embeddings import Embedder
from services.retriever.ingest import read_jsonl as read_documents_jsonl
from services.retriever.settings import IndexKind, RetrieverSettings
from services.retriever.vector_cache import CachingEncoder, VectorCache, with_cache

TENANT = "bench"
DEFAULT_CHUNKS = 10_000  # the target: p50 < 20 ms over 10k chunks (flat)
DEFAULT_K = 4
DEFAULT_REPEATS = 20  # passes over the question list
WARMUP_QUERIES = 5  # first calls pay lazy initialisation; not timed
DEFAULT_NOISE = 0.3  # filler vector = normalize(v + noise * N(0, I) / sqrt(dim))
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


def build_core(
    target_chunks: int, squad_dir: Path | None, noise: float, settings: RetrieverSettings
) -> tuple[RetrieverCore, dict[str, int]]:
    """A core whose tenant TENANT holds >= target_chunks chunks (real first, then variants)."""
    embedder = Embedder(settings.embedder_path, batch_size=settings.embed_batch_size)
    docs = list(read_documents_jsonl(bundled_corpus_path()))
    if squad_dir is not None:
        docs += list(read_documents_jsonl(squad_dir / "corpus.jsonl"))
    chunks = [c for d in docs for c in make_chunks(d, settings.chunk_chars, settings.chunk_overlap)]
    texts = [c.embedding_text() for c in chunks]
    vectors = with_cache(embedder, settings.vector_cache, embedder.name).encode(texts)  # [n, dim]
    fill = max(0, target_chunks - len(texts))
    extra_docs, extra_texts, extra_vectors = variants(chunks, vectors, fill, settings, noise)
    cache = VectorCache.build(embedder.name, [*texts, *extra_texts], np.concatenate([vectors, extra_vectors]))
    core = RetrieverCore(settings, embedder=CachingEncoder(embedder, cache))
    core.ingest(TENANT, [*docs, *extra_docs])
    return core, {"real_chunks": len(texts), "variant_chunks": len(extra_texts)}


def questions_for(squad_dir: Path | None) -> list[str]:
    questions = [q["question"] for q in read_jsonl(sample_questions_path())]
    if squad_dir is not None:
        questions += [q["question"] for q in read_jsonl(squad_dir / "questions.jsonl")]
    return questions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lookahead-rag-bench retrieval", description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS, help="index size to reach")
    parser.add_argument("--squad", type=Path, help="folder with corpus.jsonl and questions.jsonl to add")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="chunks per search")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="passes over the questions")
    parser.add_argument("--noise", type=float, default=DEFAULT_NOISE, help="variant vectors' noise level")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads, as a standalone retriever runs (0: torch's default)"
    )
    parser.add_argument("--json", type=Path, help="write the results here as well")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    settings = RetrieverSettings(data_dir=None, index_kind=IndexKind.FLAT, torch_threads=args.threads)
    start = time.perf_counter()
    core, sizes = build_core(args.chunks, args.squad, args.noise, settings)
    build_s = time.perf_counter() - start
    base_questions = questions_for(args.squad)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
