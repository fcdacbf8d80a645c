"""One encoder shared by every tenant: ingest embeds in small turns, and a waiting query goes first.

The embedding model runs one call at a time (``embeddings.Embedder`` serializes them: its tokenizer is
not thread-safe, and on a small CPU parallel encodes only compete for the same cores). An Ingest of
thousands of chunks in one call would hold it for minutes, and every tenant's Retrieve (one query
embedding each) would wait behind it past its deadline. ``GatedEncoder`` therefore embeds bulk texts
(ingest, replicated document events) ``slice_texts`` at a time, each slice one turn at the ``EncoderGate``,
and a query (``encode_one``: Retrieve, a past session's question) waiting at the gate takes the next
turn before any bulk slice does: a Retrieve waits for one slice at most, whoever is ingesting.

    encoder = GatedEncoder(Embedder(), slice_texts=8, busy_share=0.25, busy_window_s=10.0)
    encoder.encode(texts)        # [n, dim], in turns of 8 texts
    encoder.encode_one(query)    # [1, dim], next in line

Turns alone do not keep the CPU: a bulk slice embeds while the engine sharing the machine (a generator in
the same process or on the same cores) decodes, and on a small CPU its forwards then wait for a core (issue
51's hostile mix: the victim's first token 3-4 s later beside one 4 MiB upload on 2 cores). So while
queries arrive (one within ``busy_window_s``), bulk embedding takes at most ``busy_share`` of the wall time:
after each slice it pauses, outside the gate, ``busy_share``'s complement of the slice's time. With no
query lately (a first load, a standalone ingest) it runs flat out.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from lookahead_rag.services.retriever.embeddings import Encoder


class EncoderGate:
    """One encoder call at a time; a waiting query is let in before any waiting bulk slice."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._busy = False  # an encoder call is running
        self._queries_waiting = 0
        self._clock = clock
        self._last_query_s = -math.inf  # when the last query asked for a turn

    def queried_within(self, window_s: float) -> bool:
        """Whether a query asked for a turn in the last ``window_s`` seconds (the retriever is serving)."""
        return self._clock() - self._last_query_s <= window_s

    @contextmanager
    def turn(self, query: bool) -> Iterator[None]:
        """Hold the encoder for one call: a query (``query``) or a bulk slice, which yields to waiting queries."""
        with self._cond:
            if query:
                self._last_query_s = self._clock()
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

    def __init__(self, inner: Encoder, slice_texts: int, gate: EncoderGate | None = None, busy_share: float = 1.0,
                 busy_window_s: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if slice_texts < 1:
            raise ValueError(f"slice_texts must be at least 1, not {slice_texts}")
        if not 0 < busy_share <= 1:
            raise ValueError(f"busy_share must be in (0, 1], not {busy_share}")
        self.inner = inner
        self.dim: int = inner.dim
        self.slice_texts = slice_texts
        self.gate = gate if gate is not None else EncoderGate(clock)
        self.busy_share = busy_share
        self.busy_window_s = busy_window_s
        self._clock, self._sleep = clock, sleep

    def pause_after(self, slice_s: float) -> float:
        """Seconds a bulk slice that embedded for ``slice_s`` pauses before the next: while queries arrive,
        enough that bulk work takes ``busy_share`` of the time; else none."""
        if self.busy_share >= 1 or not self.gate.queried_within(self.busy_window_s):
            return 0.0
        return slice_s * (1 - self.busy_share) / self.busy_share

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[n, dim] float32, embedded ``slice_texts`` at a time (a waiting query goes between two slices; while
        queries arrive, paced to ``busy_share`` of the time)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        pause = 0.0
        for start in range(0, len(texts), self.slice_texts):
            if pause:
                self._sleep(pause)
            with self.gate.turn(query=False):
                began = self._clock()
                parts.append(self.inner.encode(texts[start : start + self.slice_texts]))
                pause = self.pause_after(self._clock() - began)
        return np.concatenate(parts)

    def encode_one(self, text: str) -> np.ndarray:
        """[1, dim] float32 for one query, embedded at the next turn."""
        with self.gate.turn(query=True):
            return self.inner.encode_one(text)
