"""Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): several rankings of the same ids
merged by the sum of 1 / (k + rank) over the rankings that hold each id, ranks counted from 1.

Rank-based, so it needs no score calibration between a dense inner product and a BM25 score; an id
that only one ranking found still enters, below ids both rankings put near their tops.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

RRF_K = 60  # the paper's constant: damps the weight of the very top ranks, robust across collections

Id = TypeVar("Id", bound=Hashable)


def rrf_scores(rankings: Sequence[Sequence[Id]], k: int = RRF_K) -> dict[Id, float]:
    """Each id's fused score: the sum over rankings of 1 / (k + its 1-based rank there)."""
    if k < 0:
        raise ValueError(f"rrf k must not be negative, got {k}")
    scores: dict[Id, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(dict.fromkeys(ranking), start=1):  # an id twice in one ranking counts once
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


def rrf(rankings: Sequence[Sequence[Id]], k: int = RRF_K) -> list[Id]:
    """The ids of all rankings, best fused score first; ties keep the order ids were first met in."""
    scores = rrf_scores(rankings, k)
    return sorted(scores, key=lambda item: -scores[item])  # stable: ties in first-met order
