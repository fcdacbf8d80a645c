"""One tenant's vector index: FAISS over chunk embeddings, with the chunk records row-aligned to it.

Row i of the FAISS index, of ``vectors`` and of ``chunks`` is the same chunk, always: all three
change together, and they are serialized into one file (``to_bytes``), so the id map and the index
cannot disagree on disk either. The vectors are kept so that replacing a document (or switching an
IVF index from flat to trained) can rebuild the index without re-embedding.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields

import faiss
import numpy as np

from lookahead_rag.services.retriever.documents import ChunkRecord, ScoredChunk
from lookahead_rag.services.retriever.settings import IndexKind, RetrieverSettings

FORMAT_VERSION = 1


class CorruptIndex(ValueError):
    """A persisted index whose parts do not agree (or cannot be read)."""


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """The index part of RetrieverSettings (see there for each field)."""

    kind: IndexKind
    ivf_nlist: int
    ivf_nprobe: int
    ivf_min_train_per_list: int
    hnsw_m: int
    hnsw_ef_construction: int
    hnsw_ef_search: int
    search_threads: int

    @classmethod
    def from_settings(cls, s: RetrieverSettings) -> IndexConfig:
        """Each field from the settings field of the same name (``kind``: ``index_kind``)."""
        same_names = {f.name: getattr(s, f.name) for f in fields(cls) if f.name != "kind"}
        return cls(kind=s.index_kind, **same_names)


def build_faiss_index(vectors: np.ndarray, config: IndexConfig) -> tuple[faiss.Index, IndexKind]:
    """An index over ``vectors`` [n, dim] (float32, normalized) and the kind actually built.

    IVF needs ``nlist * min_train_per_list`` vectors to train; below that the index stays flat (exact).
    """
    n, dim = vectors.shape
    kind = config.kind
    if kind is IndexKind.IVF and n < config.ivf_nlist * config.ivf_min_train_per_list:
        kind = IndexKind.FLAT
    if kind is IndexKind.HNSW:
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    elif kind is IndexKind.IVF:
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, config.ivf_nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    else:
        index = faiss.IndexFlatIP(dim)
    if n:
        index.add(vectors)
    _set_search_params(index, kind, config)
    return index, kind


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """FAISS's OpenMP thread count for the calling thread only, restored afterwards.

    A single-query flat search over 10k x 384 takes ~0.3 ms on one thread but ~16 ms with two on a
    busy 2-core machine (fork/join waits for a core); the setting is per thread, so worker threads
    of asyncio.to_thread need it at each call.
    """
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def _set_search_params(index: faiss.Index, kind: IndexKind, config: IndexConfig) -> None:
    if kind is IndexKind.HNSW:
        index.hnsw.efSearch = config.hnsw_ef_search
    elif kind is IndexKind.IVF:
        index.nprobe = config.ivf_nprobe


class TenantIndex:
    """Chunks of one tenant, searchable by inner product. Not thread-safe: the caller locks."""

    def __init__(self, tenant: str, dim: int, config: IndexConfig) -> None:
        self.tenant = tenant
        self.dim = dim
        self.config = config
        self.chunks: list[ChunkRecord] = []
        self.vectors = np.zeros((0, dim), dtype=np.float32)  # [n, dim]
        self.doc_digests: dict[str, str] = {}  # doc id -> content digest of the ingested version
        self.changes = 0  # bumped by every add/remove in this process (which save is newer); not persisted
        self._fingerprint: tuple[int, str] | None = None  # (changes, fingerprint) cache
        self.index, self.built_kind = build_faiss_index(self.vectors, config)

    def __len__(self) -> int:
        return len(self.chunks)

    def _rebuild(self) -> None:
        self.index, self.built_kind = build_faiss_index(self.vectors, self.config)

    def add(self, chunks: Sequence[ChunkRecord], vectors: np.ndarray, digests: dict[str, str]) -> None:
        """Append chunks with their vectors [len(chunks), dim]; ``digests`` records their documents."""
        if vectors.shape != (len(chunks), self.dim):
            raise ValueError(f"vectors {vectors.shape} do not match {len(chunks)} chunks of dim {self.dim}")
        self.changes += 1
        if not chunks:
            self.doc_digests.update(digests)
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.vectors = np.concatenate([self.vectors, vectors])
        self.chunks.extend(chunks)
        self.doc_digests.update(digests)
        wants_training = self.config.kind is IndexKind.IVF and self.built_kind is IndexKind.FLAT
        if wants_training and len(self.chunks) >= self.config.ivf_nlist * self.config.ivf_min_train_per_list:
            self._rebuild()  # enough vectors now: train the IVF index on all of them
        else:
            self.index.add(vectors)

    def remove_documents(self, doc_ids: Iterable[str]) -> int:
        """Drop every chunk of these documents and rebuild; returns chunks removed."""
        gone = set(doc_ids)
        keep = [i for i, chunk in enumerate(self.chunks) if chunk.doc_id not in gone]
        removed = len(self.chunks) - len(keep)
        if removed or gone & self.doc_digests.keys():
            self.changes += 1
        for doc_id in gone:
            self.doc_digests.pop(doc_id, None)
        if removed:
            self.chunks = [self.chunks[i] for i in keep]
            self.vectors = np.ascontiguousarray(self.vectors[keep])
            self._rebuild()
        return removed

    def fingerprint(self) -> str:
        """A hash of which documents, at which versions, the index holds (cached until the next change)."""
        if self._fingerprint is None or self._fingerprint[0] != self.changes:
            listing = json.dumps(sorted(self.doc_digests.items()), separators=(",", ":")).encode()
            self._fingerprint = (self.changes, hashlib.sha256(listing).hexdigest())
        return self._fingerprint[1]

    def search(self, query: np.ndarray, k: int) -> list[ScoredChunk]:
        """Top-k chunks for ``query`` [1, dim], best first."""
        if k <= 0 or not self.chunks:
            return []
        with omp_threads(self.config.search_threads):
            scores, rows = self.index.search(query, min(k, len(self.chunks)))  # [1, k] each
        return [
            ScoredChunk(self.chunks[int(row)], float(score))
            for score, row in zip(scores[0], rows[0], strict=True)
            if row >= 0
        ]

    def to_bytes(self) -> bytes:
        """Chunks, digests, vectors and (non-flat) index in one npz blob."""
        meta = {
            "version": FORMAT_VERSION,
            "tenant": self.tenant,
            "dim": self.dim,
            "built_kind": self.built_kind.value,
            "chunks": [c.to_json() for c in self.chunks],
            "doc_digests": self.doc_digests,
        }
        arrays: dict[str, np.ndarray] = {
            "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            "vectors": self.vectors,
        }
        if self.built_kind is not IndexKind.FLAT:  # flat is rebuilt from the vectors in no time
            arrays["index"] = faiss.serialize_index(self.index)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, config: IndexConfig) -> TenantIndex:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                meta = json.loads(npz["meta"].tobytes())
                vectors = np.ascontiguousarray(npz["vectors"], dtype=np.float32)
                raw_index = npz["index"] if "index" in npz.files else None
        except (OSError, ValueError, KeyError) as exc:
            raise CorruptIndex(f"unreadable index file: {exc}") from exc
        if meta.get("version") != FORMAT_VERSION:
            raise CorruptIndex(f"index format {meta.get('version')} is not {FORMAT_VERSION}")
        loaded = cls(meta["tenant"], int(meta["dim"]), config)
        loaded.chunks = [ChunkRecord.from_json(c) for c in meta["chunks"]]
        loaded.doc_digests = dict(meta["doc_digests"])
        loaded.vectors = vectors
        if vectors.shape != (len(loaded.chunks), loaded.dim):
            raise CorruptIndex(f"{vectors.shape[0]} vectors for {len(loaded.chunks)} chunks")
        built = IndexKind(meta["built_kind"])
        if raw_index is not None and built is config.kind:
            loaded.index, loaded.built_kind = faiss.deserialize_index(raw_index), built
            _set_search_params(loaded.index, built, config)
        else:  # flat, or the configured kind changed since it was saved
            loaded._rebuild()
        if loaded.index.ntotal != len(loaded.chunks):
            raise CorruptIndex(f"index holds {loaded.index.ntotal} rows for {len(loaded.chunks)} chunks")
        return loaded
