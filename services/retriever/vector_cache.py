"""Precomputed embeddings, looked up by text: the bundled corpus ingests in seconds instead of a minute.

Embedding ~1,300 chunks takes about a minute on a 2-core CPU; the project ships their vectors
(``services/data/stdlib_corpus.vectors.npz``, float16, made by ``lookahead_rag.services.retriever.stdlib_corpus
--vectors``) so the embedded default is ready at once. ``CachingEncoder`` answers a text from the
cache when the exact text (and embedding model) matches and encodes the rest; a stale or foreign
cache only costs speed, never correctness beyond float16 rounding of the cached vectors.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lookahead_rag.services.retriever.embeddings import Encoder

log = logging.getLogger(__name__)

KEY_BYTES = 16  # truncated sha256 of the text: collisions are out of reach for any real corpus
STORE_DTYPE = np.float16  # halves the shipped file; cosine scores move by ~1e-3


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:KEY_BYTES]


class VectorCache:
    """text -> unit vector [dim] for one embedding model."""

    def __init__(self, model: str, dim: int, vectors: dict[bytes, np.ndarray]) -> None:
        self.model = model
        self.dim = dim
        self._vectors = vectors

    def __len__(self) -> int:
        return len(self._vectors)

    def get(self, text: str) -> np.ndarray | None:
        return self._vectors.get(text_key(text))

    @classmethod
    def build(cls, model: str, texts: Sequence[str], vectors: np.ndarray) -> VectorCache:
        """From texts and their vectors [n, dim]."""
        return cls(model, int(vectors.shape[1]), {text_key(t): v for t, v in zip(texts, vectors, strict=True)})

    def to_bytes(self) -> bytes:
        keys = sorted(self._vectors)
        buf = io.BytesIO()
        np.savez_compressed(
            buf,
            model=np.array(self.model),
            keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), KEY_BYTES),
            vectors=np.stack([self._vectors[k] for k in keys]).astype(STORE_DTYPE)
            if keys
            else np.zeros((0, self.dim), STORE_DTYPE),
        )
        return buf.getvalue()

    @classmethod
    def load(cls, path: Path) -> VectorCache:
        with np.load(path, allow_pickle=False) as npz:
            model = str(npz["model"])
            keys = npz["keys"]
            vectors = npz["vectors"].astype(np.float32)  # [n, dim]
        return cls(model, int(vectors.shape[1]), {bytes(k): v for k, v in zip(keys, vectors, strict=True)})


class CachingEncoder:
    """An Encoder that serves cached texts from a VectorCache and encodes only the others."""

    def __init__(self, inner: Encoder, cache: VectorCache) -> None:
        if cache.dim != inner.dim:
            raise ValueError(f"vector cache has dim {cache.dim}, the encoder {inner.dim}")
        self.inner = inner
        self.cache = cache
        self.dim = inner.dim
        self.name: str = getattr(inner, "name", "")
        self.hits = 0  # texts answered from the cache so far

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[n, dim] float32, unit rows."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        missing: list[int] = []
        for i, text in enumerate(texts):
            cached = self.cache.get(text)
            if cached is None:
                missing.append(i)
            else:
                out[i] = cached
        if missing:
            out[missing] = self.inner.encode([texts[i] for i in missing])
        self.hits += len(texts) - len(missing)
        if len(texts) > len(missing):
            log.info("vector cache: %d of %d texts precomputed", len(texts) - len(missing), len(texts))
        return out

    def encode_one(self, text: str) -> np.ndarray:
        return self.inner.encode_one(text)  # queries are new texts: no lookup


def with_cache(encoder: Encoder, path: Path | None, model: str) -> Encoder:
    """``encoder`` wrapped with the cache at ``path`` when it exists and was made by ``model``."""
    if path is None or not path.exists():
        return encoder
    try:
        cache = VectorCache.load(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring unreadable vector cache %s: %s", path, exc)
        return encoder
    if cache.model != model or cache.dim != encoder.dim:
        log.warning("ignoring vector cache %s: made by %s (dim %d), not %s", path, cache.model, cache.dim, model)
        return encoder
    return CachingEncoder(encoder, cache)
