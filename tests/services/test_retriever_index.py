"""Tenant indexes: search, replacement, IVF/HNSW, persistence across restarts, atomic writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lookahead_rag.bench.retrieval import measure_retrieval, variants
from lookahead_rag.services.common import atomic
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document, make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.index import CorruptIndex, IndexConfig, TenantIndex
from lookahead_rag.services.retriever.settings import IndexKind
from lookahead_rag.services.retriever.store import INDEX_DIR
from lookahead_rag.services.retriever.vector_cache import CachingEncoder, VectorCache, with_cache
from tests.services.retriever_helpers import settings

DOCS = [
    Document("json.dumps", "json.dumps(obj, ...)", "Serialize obj to a JSON formatted str."),
    Document("csv.reader", "csv.reader(f)", "Return a reader object that iterates over lines in a CSV file."),
    Document("os.path.splitext", "os.path.splitext(p)", "Split the extension from a pathname."),
    Document("heapq.nlargest", "heapq.nlargest(n, iterable)", "Find the n largest elements in a dataset."),
]
QUESTIONS = ["How do I write JSON?", "How can I read a CSV file?", "get the file extension of a path"]


def make_core(embedder: Embedder, tok: Any, data_dir: Path | None, **overrides: Any) -> RetrieverCore:
    return RetrieverCore(settings(data_dir, **overrides), embedder=embedder, tokenizer=tok)


def answers(core: RetrieverCore, tenant: str = "t", k: int = 3) -> list[list[tuple[str, float]]]:
    return [[(h.chunk.chunk_id, h.score) for h in core.search(tenant, q, k)] for q in QUESTIONS]


def test_search_finds_the_right_document(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok, None)
    result = core.ingest("t", DOCS)
    assert (result.documents, result.chunks, result.total_chunks) == (4, 4, 4)
    tops = [hits[0][0] for hits in answers(core)]
    assert tops == ["json.dumps#0", "csv.reader#0", "os.path.splitext#0"]
    scores = [s for _, s in answers(core)[0]]
    assert scores == sorted(scores, reverse=True)


def test_reingest_skips_unchanged_and_replaces_changed(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok, None)
    core.ingest("t", DOCS)
    again = core.ingest("t", DOCS)
    assert (again.documents, again.unchanged, again.chunks, again.total_chunks) == (0, 4, 0, 4)
    changed = Document("csv.reader", "csv.reader(f)", "Totally different: returns a frobnicator for widgets.")
    result = core.ingest("t", [changed])
    assert (result.documents, result.chunks, result.total_chunks) == (1, 1, 4)
    texts = {h.chunk.text for h in core.search("t", "frobnicator widgets", 4)}
    assert changed.text in texts and DOCS[1].text not in texts


def test_persistence_across_restart_gives_identical_results(
    tmp_path: Path, embedder: Embedder, tok: Any
) -> None:
    core = make_core(embedder, tok, tmp_path)
    core.ingest("t", DOCS)
    core.ingest("other", DOCS[:1])
    before = answers(core)
    reloaded = make_core(embedder, tok, tmp_path)
    assert answers(reloaded) == before
    assert reloaded.stats().tenants == ["other", "t"]
    assert reloaded.stats("other").chunks == 1


def test_crash_between_temp_write_and_rename_keeps_old_state(
    tmp_path: Path, embedder: Embedder, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(embedder, tok, tmp_path)
    core.ingest("t", DOCS[:2])
    before = answers(core)

    class Crash(BaseException):
        pass

    def crash(src: Any, dst: Any) -> None:  # the process dies after the temp file is complete
        raise Crash

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(Crash):
        core.ingest("t", DOCS[2:])
    monkeypatch.undo()
    # a real crash leaves the complete temp file behind: put one back, as a crash would
    (tmp_path / INDEX_DIR / ".leftover.npz.tmp").write_bytes(b"half-written garbage")
    reloaded = make_core(embedder, tok, tmp_path)
    assert answers(reloaded) == before
    assert reloaded.stats("t").chunks == 2
    assert not list((tmp_path / INDEX_DIR).glob("*.tmp"))  # stale temps are cleaned on load


def test_write_atomic_fsyncs_and_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    target = tmp_path / "f.bin"
    atomic.write_bytes_atomic(target, b"one")
    atomic.write_bytes_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert len(synced) == 4  # file and directory, twice
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_disagreeing_file_is_refused(embedder: Embedder) -> None:
    config = IndexConfig.from_settings(settings())
    index = TenantIndex("t", embedder.dim, config)
    index.add([], np.zeros((0, embedder.dim), np.float32), {})
    blob = index.to_bytes()
    broken = TenantIndex.from_bytes(blob, config)
    broken.vectors = np.ones((3, embedder.dim), np.float32)  # 3 vectors, 0 chunks
    with pytest.raises(CorruptIndex, match="3 vectors for 0 chunks"):
        TenantIndex.from_bytes(broken.to_bytes(), config)
    with pytest.raises(CorruptIndex):
        TenantIndex.from_bytes(b"not an index", config)


@pytest.mark.parametrize("kind", [IndexKind.IVF, IndexKind.HNSW])
def test_approximate_kinds_find_exact_duplicates_and_persist(
    kind: IndexKind, tmp_path: Path, embedder: Embedder
) -> None:
    rng = np.random.default_rng(0)
    n, nlist = 400, 4
    vectors = rng.standard_normal((n, embedder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    config = IndexConfig.from_settings(settings(index_kind=kind, ivf_nlist=nlist, ivf_min_train_per_list=10))
    index = TenantIndex("t", embedder.dim, config)
    chunks = [Document(f"d{i}", "", f"text {i}") for i in range(n)]
    records = [make_chunks(d, 100, 10)[0] for d in chunks]
    index.add(records, vectors, {d.id: d.digest() for d in chunks})
    assert index.built_kind is kind
    for row in (0, 123, 399):
        assert index.search(vectors[row : row + 1], 1)[0].chunk.doc_id == f"d{row}"
    reloaded = TenantIndex.from_bytes(index.to_bytes(), config)
    assert reloaded.built_kind is kind
    assert [h.chunk.doc_id for h in reloaded.search(vectors[5:6], 3)] == [
        h.chunk.doc_id for h in index.search(vectors[5:6], 3)
    ]


def test_ivf_stays_exact_until_it_has_enough_vectors(embedder: Embedder) -> None:
    config = IndexConfig.from_settings(settings(index_kind=IndexKind.IVF, ivf_nlist=64))
    index = TenantIndex("t", embedder.dim, config)
    assert index.built_kind is IndexKind.FLAT


def test_vector_cache_serves_hits_and_encodes_misses(tmp_path: Path, embedder: Embedder) -> None:
    texts = ["alpha beta", "gamma delta"]
    fresh = embedder.encode(texts)
    path = tmp_path / "v.npz"
    path.write_bytes(VectorCache.build(embedder.name, texts[:1], fresh[:1]).to_bytes())
    encoder = with_cache(embedder, path, embedder.name)
    assert isinstance(encoder, CachingEncoder)
    out = encoder.encode(texts)
    assert encoder.hits == 1
    np.testing.assert_allclose(out, fresh, atol=2e-3)  # the hit went through float16 storage
    assert with_cache(embedder, path, "another-model") is embedder
    assert with_cache(embedder, tmp_path / "missing.npz", embedder.name) is embedder


def test_bench_measure_retrieval_and_variant_filler(embedder: Embedder, tok: Any) -> None:
    core = make_core(embedder, tok, None)
    s = core.settings
    chunks = [c for d in DOCS for c in make_chunks(d, s.chunk_chars, s.chunk_overlap)]
    vectors = embedder.encode([c.embedding_text() for c in chunks])
    docs, texts, noisy = variants(chunks, vectors, 10, s, noise=0.3)
    assert len(docs) == len(texts) == noisy.shape[0] == 10 and len(set(texts)) == 10
    np.testing.assert_allclose(np.linalg.norm(noisy, axis=1), 1.0, rtol=1e-5)
    core.ingest("t", DOCS)
    result = measure_retrieval(core, "t", QUESTIONS, k=2)
    assert set(result) == {"chunks", "p50_ms", "p99_ms"} and result["chunks"] == len(DOCS)
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_index_config_takes_each_field_from_the_settings() -> None:
    s = settings(index_kind=IndexKind.HNSW, ivf_nlist=3, ivf_nprobe=2, ivf_min_train_per_list=5, hnsw_m=7,
                 hnsw_ef_construction=11, hnsw_ef_search=13, search_threads=2)
    assert IndexConfig.from_settings(s) == IndexConfig(IndexKind.HNSW, 3, 2, 5, 7, 11, 13, 2)
