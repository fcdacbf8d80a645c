"""One encoder shared by every tenant: ingest embeds in small turns, and a waiting query goes first.

The embedding model runs one call at a time (``embeddings.Embedder`` serializes them: its tokenizer is
not thread-safe, and on a small CPU parallel encodes only compete for the same cores). An Ingest of
thousands of chunks in one call would hold it for minutes, and every tenant's Retrieve (one query
embedding each) would wait behind it past its deadline. ``GatedEncoder`` therefore embeds bulk texts
(ingest, replicated document events) ``slice_texts`` at a time, each slice one turn at the ``EncoderGate``,
and a query (``encode_one``: Retrieve, a past session's question) waiting at the gate takes the next
turn before any bulk slice does: a Retrieve waits for one slice at most, whoever is ingesting.

    encoder = GatedEncoder(Embedder(), slice_texts=8)
    encoder.encode(texts)        # [n, dim], in turns of 8 texts
    encoder.encode_one(query)    # [1, dim], next in line
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from lookahead_rag.services.retriever.embeddings import Encoder


class EncoderGate:
    """One encoder call at a time; a waiting query is let in before any waiting bulk slice."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False  # an encoder call is running
        self._queries_waiting = 0

    @contextmanager
    def turn(self, query: bool) -> Iterator[None]:
        """Hold the encoder for one call: a query (``query``) or a bulk slice, which yields to waiting queries."""
        with self._cond:
            self._queries_waiting += int(query)
            try:
                while self._busy or (not query and self._queries_waiting):
                    self._cond.wait()
            finally:
                self._queries_waiting -= int(query)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class GatedEncoder:
    """An Encoder whose calls take turns at an ``EncoderGate``: bulk in slices, queries first."""

    def __init__(self, inner: Encoder, slice_texts: int, gate: EncoderGate | None = None) -> None:
        if slice_texts < 1:
            raise ValueError(f"slice_texts must be at least 1, not {slice_texts}")
        self.inner = inner
        self.dim: int = inner.dim
        self.slice_texts = slice_texts
        self.gate = gate if gate is not None else EncoderGate()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[n, dim] float32, embedded ``slice_texts`` at a time (a waiting query goes between two slices)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for start in range(0, len(texts), self.slice_texts):
            with self.gate.turn(query=False):
                parts.append(self.inner.encode(texts[start : start + self.slice_texts]))
        return np.concatenate(parts)

    def encode_one(self, text: str) -> np.ndarray:
        """[1, dim] float32 for one query, embedded at the next turn."""
        with self.gate.turn(query=True):
            return self.inner.encode_one(text)
