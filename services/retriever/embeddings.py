"""Sentence embeddings: all-MiniLM-L6-v2 (sentence-transformers) from a local folder, offline.

Vectors are L2-normalized float32, so inner product = cosine similarity. Encoding is serialized by
a lock: the fast tokenizer is not safe to call from several threads at once, and on a 2-core CPU
parallel encodes would only compete for the same cores.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from lookahead_rag.services.retriever.settings import default_embedder_path

DEFAULT_BATCH_SIZE = 64
DEFAULT_PROGRESS_MIN_TEXTS = 256


class Encoder(Protocol):
    """What the index and past sessions need from an embedding model."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_one(self, text: str) -> np.ndarray: ...


class Embedder:
    """Encode texts to normalized vectors of shape [n, dim] (float32)."""

    def __init__(
        self,
        path: Path | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress_min_texts: int = DEFAULT_PROGRESS_MIN_TEXTS,
        device: str = "cpu",
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder never needs the hub
        from sentence_transformers import SentenceTransformer  # heavy: import on first use

        self.path = Path(path) if path is not None else default_embedder_path()
        if not (self.path / "modules.json").exists():
            raise FileNotFoundError(f"{self.path} is not a sentence-transformers model folder")
        self._model = SentenceTransformer(str(self.path), device=device, local_files_only=True)
        self.dim: int = int(self._model.get_embedding_dimension())
        self.batch_size = batch_size
        self.progress_min_texts = progress_min_texts
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """Identifies the vector space: indexes built with another model must not be mixed in."""
        return self.path.name if self.path.name != "model" else self.path.parent.name

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[n, dim] float32, rows of unit length; a progress bar shows for large batches."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=len(texts) >= self.progress_min_texts,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        """[1, dim] float32 for a single query."""
        return self.encode([text])
