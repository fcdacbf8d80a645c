"""The Jacobi lookahead window's pure parts (lookahead_core.drafting.jacobi) on hand-made token lists."""

from __future__ import annotations

import doctest
from collections.abc import Callable

import pytest
from lookahead_core.drafting import jacobi
from lookahead_core.drafting.jacobi import (
    JacobiConfig,
    NgramPool,
    advance,
    choose_window,
    initial_window,
    positions,
    window_mask,
)

W2N3 = JacobiConfig(window=2, ngram=3, guesses=2)
W3N4 = JacobiConfig(window=3, ngram=4, guesses=2)


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(jacobi).failed == 0


@pytest.mark.parametrize(("context", "config", "row0"), [
    ([1, 2, 3], W2N3, (2, 3)),  # the last W context tokens
    ([7], W3N4, (7, 7, 7)),  # a context shorter than W is repeated
    ([4, 5], W3N4, (4, 5, 4)),  # ... cyclically
])
def test_initial_window_seeds_row_0_from_the_context(context: list[int], config: JacobiConfig,
                                                     row0: tuple[int, ...]) -> None:
    assert initial_window(context, config) == (row0,)


def test_initial_window_needs_a_context() -> None:
    with pytest.raises(ValueError, match="non-empty context"):
        initial_window([], W2N3)


@pytest.mark.parametrize(("window", "predictions", "config", "next_window", "grams"), [
    # filling: one row, N=3 wants two: the predictions become row 1, nothing harvested
    (((5, 6),), [7, 8], W2N3, ((5, 6), (7, 8)), []),
    # full: each column top to bottom plus its new token is an n-gram; row 0 is dropped
    (((5, 6), (7, 8)), [9, 4], W2N3, ((7, 8), (9, 4)), [(5, 7, 9), (6, 8, 4)]),
    # N=4, W=3, full (3 rows): 3 four-grams, one per column
    (((1, 2, 3), (4, 5, 6), (7, 8, 9)), [10, 11, 12], W3N4,
     ((4, 5, 6), (7, 8, 9), (10, 11, 12)), [(1, 4, 7, 10), (2, 5, 8, 11), (3, 6, 9, 12)]),
    # N=4 with two rows: still filling
    (((1, 2, 3), (4, 5, 6)), [7, 8, 9], W3N4, ((1, 2, 3), (4, 5, 6), (7, 8, 9)), []),
])
def test_advance_harvests_only_this_windows_columns(window: jacobi.Window, predictions: list[int],
                                                    config: JacobiConfig, next_window: jacobi.Window,
                                                    grams: list[tuple[int, ...]]) -> None:
    got_window, got_grams = advance(window, predictions, config)
    assert got_window == next_window
    assert got_grams == grams
    produced = {t for row in window for t in row} | set(predictions)
    assert all(set(g) <= produced for g in got_grams)  # every n-gram came from this iteration's tokens


def test_advance_refuses_predictions_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match="width"):
        advance(((5, 6),), [7], W2N3)


def test_positions_shift_each_row_one_to_the_right() -> None:
    # row 0 at 1..W, row 1 at 2..W+1: column j's tokens are consecutive positions
    assert positions(((5, 6, 7), (8, 9, 10))) == [1, 2, 3, 2, 3, 4]


def test_window_mask_sees_row_0_up_to_its_column_and_its_own_column_above() -> None:
    # W=2, 2 rows; flat order (0,0) (0,1) (1,0) (1,1)
    mask = window_mask(((5, 6), (7, 8)))
    assert mask == [
        [True, False, False, False],  # (0,0): itself
        [True, True, False, False],  # (0,1): row 0 up to column 1
        [True, False, True, False],  # (1,0): (0,0) and itself
        [True, True, False, True],  # (1,1): (0,0), (0,1) and itself, not (1,0)
    ]


def test_window_mask_positions_form_a_contiguous_sequence_for_every_token() -> None:
    window = ((1, 2, 3), (4, 5, 6), (7, 8, 9))
    pos, mask = positions(window), window_mask(window)
    for i, row in enumerate(mask):
        seen = sorted(pos[k] for k, visible in enumerate(row) if visible)
        assert seen == list(range(1, pos[i] + 1))  # positions 1..own, each once: a causal sequence


@pytest.mark.parametrize(("puts", "first", "tails"), [
    ([(5, 7, 9)], 5, [(7, 9)]),  # one n-gram
    ([(5, 7, 9), (5, 8, 1)], 5, [(8, 1), (7, 9)]),  # newest first
    ([(5, 7, 9), (5, 8, 1), (5, 7, 9)], 5, [(7, 9), (8, 1)]),  # produced again: moves to the front
    ([(5, 7, 9), (5, 8, 1), (5, 2, 2)], 5, [(2, 2), (8, 1)]),  # at most G=2 kept: the oldest goes
    ([(5, 7, 9)], 6, []),  # no n-gram starts with 6
    ([(5,)], 5, []),  # a 1-gram continues nothing
])
def test_pool_keeps_the_newest_g_continuations_per_first_token(puts: list[tuple[int, ...]], first: int,
                                                               tails: list[tuple[int, ...]]) -> None:
    pool = NgramPool(guesses=2)
    pool.put(puts)
    assert pool.get(first) == tails


@pytest.mark.parametrize("bad", [dict(window=-1, ngram=3, guesses=1), dict(window=2, ngram=1, guesses=1),
                                 dict(window=2, ngram=3, guesses=0)])
def test_config_refuses_impossible_shapes(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        JacobiConfig(**bad)


def flat(n: int) -> float:
    return 1.0  # extra tokens cost nothing


def linear(n: int) -> float:
    return float(n)  # every token costs as much as the first


def gpu_like(n: int) -> float:
    return 1.0 + n / 100  # the docstring's example


def stepped(n: int) -> float:
    return 1.0 if n <= 16 else 2.0  # free up to 16 tokens, then twice the cost


# (cost curve, base tokens, N, max window, max overhead, chosen W)
WINDOW_CASES = [
    (flat, 9, 3, 8, 0.1, 8),  # free tokens: the widest window
    (linear, 9, 3, 8, 0.1, 0),  # each of W * (N - 1) tokens costs 1/9 of the forward: none fits 10%
    (linear, 9, 3, 8, 1.0, 4),  # overhead 100%: up to 9 more tokens, W * 2 <= 9
    (gpu_like, 9, 3, 8, 0.1, 5),  # the docstring's example
    (stepped, 9, 3, 8, 0.1, 3),  # 9 + 3 * 2 = 15 tokens still free, W = 4 (17 tokens) doubles the cost
    (stepped, 9, 5, 8, 0.1, 1),  # N = 5: 4 tokens per W; 9 + 4 = 13 fits, 17 does not
    (flat, 9, 3, 2, 0.1, 2),  # never past max_window
]


@pytest.mark.parametrize(("cost", "base", "ngram", "max_w", "overhead", "want"), WINDOW_CASES)
def test_choose_window(cost: Callable[[int], float], base: int, ngram: int, max_w: int, overhead: float,
                       want: int) -> None:
    assert choose_window(cost, base, ngram, max_w, overhead) == want


def test_choose_window_refuses_an_empty_forward() -> None:
    with pytest.raises(ValueError, match="base_tokens"):
        choose_window(flat, 0, 3)
