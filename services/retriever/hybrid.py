"""Hybrid search of one tenant: the FAISS ranking and the BM25 ranking of its chunks, fused by RRF.

Each ranking contributes its top ``depth`` chunks (at least ``k``); the fused top ``k`` are returned
in fused order, each scored with its dense inner product with the query (the score the dense search
gives, so a passage's score means the same in either mode and past answers compare with it), computed
from the stored vector for a chunk only the lexical ranking found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lookahead_rag.services.retriever.documents import ChunkRecord, ScoredChunk
from lookahead_rag.services.retriever.fusion import rrf
from lookahead_rag.services.retriever.index import TenantIndex
from lookahead_rag.services.retriever.lexical import LexicalIndexes


@dataclass(frozen=True, slots=True)
class HybridConfig:
    depth: int  # chunks each ranking contributes before fusion
    rrf_k: int  # the fusion's rank constant (fusion.RRF_K)


def hybrid_search(index: TenantIndex, lexical: LexicalIndexes, question: str, query: np.ndarray, k: int,
                  config: HybridConfig) -> list[ScoredChunk]:
    """The tenant's top-k chunks for ``question`` (text) and ``query`` (its vector [1, dim]), fused order.

    The caller holds the lock guarding ``index`` (and ``lexical``, which is rebuilt here when stale).
    """
    if k <= 0 or not index.chunks:
        return []
    depth = max(k, config.depth)
    dense = index.search(query, depth)
    rows = lexical.search(index, question, depth)
    dense_ids = [hit.chunk.chunk_id for hit in dense]
    lexical_ids = [index.chunks[row].chunk_id for row in rows]
    by_id: dict[str, ChunkRecord] = {hit.chunk.chunk_id: hit.chunk for hit in dense}
    scores: dict[str, float] = {hit.chunk.chunk_id: hit.score for hit in dense}
    for row in rows:
        chunk = index.chunks[row]
        if chunk.chunk_id not in scores:
            by_id[chunk.chunk_id] = chunk
            scores[chunk.chunk_id] = float(index.vectors[row] @ query[0])
    fused = rrf([dense_ids, lexical_ids], config.rrf_k)
    return [ScoredChunk(by_id[chunk_id], scores[chunk_id]) for chunk_id in fused[:k]]
