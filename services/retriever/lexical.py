"""One tenant's lexical index: BM25 (bm25s) over the same chunks, row for row, as its FAISS index.

Row i of a ``LexicalIndex`` is row i of the tenant's ``TenantIndex`` (``chunks[i]``), so a lexical hit
is a row id the dense index and the fusion share. bm25s builds an index whole, so ``LexicalIndexes``
keeps one per tenant and rebuilds it on the first search after the tenant's index changed: a
``TenantIndex`` counts every add and removal (``changes``), and Ingest, Delete and replicated
``DocumentChanged`` events all change it through ``TenantIndexes.apply``; a reloaded index is a new
object. A search therefore never reads rows of a deleted document, nor another tenant's rows.
Forget changes past sessions only (documents stay until deleted), which this index does not hold.

A rebuild never holds the lock every tenant's search takes (``TenantIndexes.lock``): ``prepare`` copies the
tenant's chunk list under it, builds outside it (one build per tenant at a time, under that tenant's own
lock) and swaps the result in under it again; a search then finds it ``ready``. ``current`` and ``search``
(which build in place when stale) are for a caller holding that lock on an index nobody else changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import bm25s
import numpy as np

from lookahead_rag.services.retriever.documents import ChunkRecord
from lookahead_rag.services.retriever.index import TenantIndex

log = logging.getLogger(__name__)

STOPWORDS = "english"  # bm25s's English stop-word list: function words match every chunk
MS_PER_S = 1000.0


def tokens(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased words of two or more characters, English stop words dropped (bm25s's tokenizer)."""
    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, return_ids=False, show_progress=False)


class LexicalIndex:
    """BM25 over a list of texts; ``search`` returns row ids, best first."""

    def __init__(self, texts: Sequence[str], k1: float, b: float) -> None:
        self.size = len(texts)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        if texts:
            self._bm25.index(tokens(texts), show_progress=False)

    def __len__(self) -> int:
        return self.size

    def search(self, query: str, k: int) -> list[int]:
        """The top ``k`` rows by BM25 score, best first; rows sharing no word with the query are left out."""
        words = tokens([query])[0]
        if k <= 0 or not self.size or not words:
            return []
        scores = np.asarray(self._bm25.get_scores(words))  # [size]
        k = min(k, self.size)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [int(row) for row in top if scores[row] > 0]


@dataclass(slots=True)
class _Built:
    source: TenantIndex  # the tenant index it was built from (a reloaded index is a new object)
    changes: int  # source.changes at build time
    lexical: LexicalIndex


class LexicalIndexes:
    """Tenant -> LexicalIndex, rebuilt lazily from the tenant's TenantIndex when that changed."""

    def __init__(self, k1: float, b: float) -> None:
        self.k1, self.b = k1, b
        self._built: dict[str, _Built] = {}
        self._building: dict[str, threading.Lock] = {}  # tenant -> held while its index is built (``prepare``)
        self._building_lock = threading.Lock()  # guards ``_building``
        self.rebuilds = 0  # how many indexes were built (tests, logs)

    def ready(self, index: TenantIndex) -> bool:
        """Whether the tenant's lexical index matches ``index``'s chunks as they are now (no build needed)."""
        built = self._built.get(index.tenant)
        return (built is not None and built.source is index and built.changes == index.changes
                and len(built.lexical) == len(index.chunks))  # the length: a change that forgot to count

    def current(self, index: TenantIndex) -> LexicalIndex:
        """The lexical index of ``index``'s chunks as they are now (built here if they changed)."""
        if not self.ready(index):
            self._install(index, index.changes, self._build(index.tenant, index.chunks))
        return self._built[index.tenant].lexical

    def prepare(self, index: TenantIndex, lock: AbstractContextManager[object]) -> bool:
        """Make the tenant's lexical index current, building it outside ``lock`` (the lock guarding
        ``index``, which every tenant's search takes); True when it is ``ready`` on return. False when
        ``index`` changed while it was being built (the next search builds again)."""
        with self._building_lock:
            building = self._building.setdefault(index.tenant, threading.Lock())
        with building:  # another search of this tenant may have built it while this one waited
            with lock:
                if self.ready(index):
                    return True
                chunks, changes = list(index.chunks), index.changes  # the list, not the chunks: cheap
            lexical = self._build(index.tenant, chunks)  # no shared lock held: other tenants search meanwhile
            with lock:
                if changes != index.changes:
                    return False
                self._install(index, changes, lexical)
                return True

    def _build(self, tenant: str, chunks: Sequence[ChunkRecord]) -> LexicalIndex:
        start = time.perf_counter()
        lexical = LexicalIndex([c.embedding_text() for c in chunks], self.k1, self.b)
        log.debug("tenant %r: lexical index of %d chunks built in %.1f ms", tenant, len(lexical),
                  (time.perf_counter() - start) * MS_PER_S)
        return lexical

    def _install(self, index: TenantIndex, changes: int, lexical: LexicalIndex) -> None:
        self._built[index.tenant] = _Built(index, changes, lexical)
        self.rebuilds += 1

    def search(self, index: TenantIndex, query: str, k: int) -> list[int]:
        """The tenant's top ``k`` rows (of ``index.chunks``) by BM25, best first."""
        return self.current(index).search(query, k)
