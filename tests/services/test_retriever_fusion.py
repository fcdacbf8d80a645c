"""Reciprocal rank fusion on tiny hand-made rankings."""

from __future__ import annotations

import pytest

from lookahead_rag.services.retriever.fusion import RRF_K, rrf, rrf_scores


def test_an_id_both_rankings_hold_beats_ids_only_one_ranks_first() -> None:
    # 2 is second in both (2/(k+2)) and beats 1 and 3, each first in one ranking only (1/(k+1))
    assert rrf([[1, 2, 4], [3, 2, 5]]) == [2, 1, 3, 4, 5]


def test_one_ranking_is_kept_as_it_is() -> None:
    # a single ranking fused alone keeps its order
    assert rrf([[7, 3, 9, 1]]) == [7, 3, 9, 1]


def test_an_id_found_by_one_ranking_only_still_enters() -> None:
    # 9 is found lexically only; it is kept, after the ids both rankings agree on
    assert rrf([[1, 2], [2, 1, 9]]) == [1, 2, 9]


def test_equal_scores_keep_the_order_first_met() -> None:
    # 1 and 3 are both first of one ranking: equal scores, 1 was met first
    assert rrf([[1], [3]]) == [1, 3]
    assert rrf([[3], [1]]) == [3, 1]


def test_scores_are_sums_of_reciprocal_ranks() -> None:
    # 5 is first in one ranking and third in the other: 1/(k+1) + 1/(k+3)
    scores = rrf_scores([[5, 6, 7], [8, 6, 5]], k=RRF_K)
    assert scores[5] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 3))
    assert scores[6] == pytest.approx(2 / (RRF_K + 2))


def test_a_small_k_lets_one_ranking_s_top_win() -> None:
    # at k=0 the top of one ranking (1/1) outweighs second place in both (1/2 + 1/2 = 1, tie broken by order)
    # and at k=60 the consensus id wins: k sets how much agreement counts against one ranking's top
    assert rrf([[1, 2], [3, 2]], k=0)[0] == 1
    assert rrf([[1, 2], [3, 2]], k=RRF_K)[0] == 2


def test_an_id_repeated_in_one_ranking_counts_once() -> None:
    # 4 listed twice in one ranking still scores once there, at its first rank
    assert rrf_scores([[4, 4, 2]])[4] == pytest.approx(1 / (RRF_K + 1))


def test_empty_rankings_fuse_to_nothing() -> None:
    # no rankings, or empty ones: nothing to return
    assert rrf([]) == []
    assert rrf([[], []]) == []


def test_a_negative_k_is_refused() -> None:
    # k < 0 would make rank 1 divide by zero or below: refused
    with pytest.raises(ValueError, match="not be negative"):
        rrf([[1]], k=-1)
