"""Draft budgets from acceptance history and a forward cost curve (budget.py): hand-made tables."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
from lookahead_core.engine.budget import accepted_within, expected_tokens, split_budget

A = [1.0, 1.8, 2.3, 2.5]  # a request whose drafts are often right (diminishing returns)
B = [1.0, 1.3, 1.4, 1.4]  # a request whose drafts are rarely right


def throughput(gains: Sequence[Sequence[float]], cost: Callable[[int], float], base: int, budgets: list[int]) -> float:
    """Tokens emitted per unit of forward cost with these budgets."""
    return sum(g[q] for g, q in zip(gains, budgets, strict=True)) / cost(base + sum(1 + q for q in budgets))


@pytest.mark.parametrize(
    ("path", "budget", "want"),
    [
        ((1, 2, 5, 9), 0, 0),  # budget 0: no draft, nothing accepted
        ((1, 2, 5, 9), 2, 2),  # nodes 1 and 2 fit
        ((1, 2, 5, 9), 4, 2),  # node 5 is past the budget: the path stops there
        ((1, 2, 5, 9), 5, 3),  # node 5 fits, node 9 does not
        ((1, 2, 5, 9), 100, 4),  # everything fits
        ((), 8, 0),  # nothing was accepted
        ((3, 4), 2, 0),  # the first accepted node is already past the budget
    ],
)
def test_accepted_within(path: tuple[int, ...], budget: int, want: int) -> None:
    assert accepted_within(path, budget) == want


@pytest.mark.parametrize(
    ("paths", "max_budget", "prior", "want"),
    [
        # two steps: (1, 2) and (1, 3); budget 2 would have lost the second step's node 3
        ([(1, 2), (1, 3)], 3, None, [1.0, 2.0, 2.5, 3.0]),
        # nothing accepted ever: plain decoding's one token whatever the budget
        ([(), ()], 2, None, [1.0, 1.0, 1.0]),
        # no history and no prior: one token per step
        ([], 2, None, [1.0, 1.0, 1.0]),
        # no history: the prior, padded with its last value
        ([], 3, [1.0, 1.5], [1.0, 1.5, 1.5, 1.5]),
        # no history: a prior that dips is made non-decreasing
        ([], 2, [1.0, 1.6, 1.4], [1.0, 1.6, 1.6]),
        # no history: a longer prior is cut to max_budget + 1 entries
        ([], 1, [1.0, 1.5, 1.9], [1.0, 1.5]),
        # history wins over the prior when there is any
        ([(1,), ()], 2, [1.0, 1.9, 2.7], [1.0, 1.5, 1.5]),
    ],
)
def test_expected_tokens(
    paths: list[tuple[int, ...]],
    max_budget: int,
    prior: list[float] | None,
    want: list[float],
) -> None:
    assert expected_tokens(paths, max_budget, prior) == pytest.approx(want)


def test_expected_tokens_never_decrease() -> None:
    # paths that skip nodes (forks): every budget's estimate is at least the smaller budget's
    paths = [(2, 7), (1, 4, 5), (9,), (), (1, 2, 3, 4, 5, 6)]
    got = expected_tokens(paths, 10)
    assert len(got) == 11 and got[0] == 1.0
    assert all(b >= a for a, b in itertools.pairwise(got))
    assert got[-1] > got[0]


@pytest.mark.parametrize(
    ("gains", "cost", "base", "max_tokens", "want"),
    [
        # the docstring's example: fixed overhead, cheap tokens -> some speculation, more for A
        ([A, B], lambda n: 10 + n, 0, 16, [2, 1]),
        # flat cost (GPU-like): every gain is taken, up to the longest useful draft
        ([A, B], lambda n: 10.0, 0, 16, [3, 2]),
        # each token costs as much as a forward (loaded CPU): plain decoding
        ([A, B], lambda n: float(n), 0, 16, [0, 0]),
        # flat cost but only 2 spare tokens: the best gain per token first, not the biggest jump
        ([[1.0, 2.0, 2.1, 2.2], [1.0, 1.9, 2.0, 2.1]], lambda n: 10.0, 0, 4, [1, 1]),
        # a prefill chunk of 12 tokens leaves room for 2 draft tokens only
        ([A, B], lambda n: 10.0, 12, 16, [2, 0]),
        # gains flat for two tokens then rising: the lookahead sees past the plateau
        ([[1.0, 1.0, 1.0, 3.0]], lambda n: 10 + n, 0, 8, [3]),
        # strictly rising gains and a flat cost grow the budget to max_tokens
        ([[1.0 + 0.1 * q for q in range(20)]], lambda n: 5.0, 0, 9, [8]),
    ],
)
def test_split_budget(
    gains: list[list[float]], cost: Callable[[int], float], base: int, max_tokens: int, want: list[int]
) -> None:
    got = split_budget(gains, cost, base, max_tokens)
    assert got == want
    assert base + sum(1 + q for q in got) <= max_tokens
    # never worse than speculation off under the cost model
    assert throughput(gains, cost, base, got) >= throughput(gains, cost, base, [0] * len(gains))


def test_split_budget_without_lookahead_stops_at_a_plateau() -> None:
    # the same flat-then-rising gains as above, but moves of one token only: no single token pays
    assert split_budget([[1.0, 1.0, 1.0, 3.0]], lambda n: 10 + n, 0, 8, lookahead=1) == [0]


def test_split_budget_refuses_a_forward_over_max_tokens() -> None:
    # two requests need two tokens; a 3-token prefill chunk leaves no room within 4
    with pytest.raises(ValueError):
        split_budget([A, B], lambda n: 1.0, 3, 4)
