"""GainsModel: expected tokens per step for each budget, from acceptance history and tree confidence."""

from __future__ import annotations

import itertools

import pytest
from lookahead_core.drafting.draft import DraftTree
from lookahead_core.engine.gains import GainsConfig, GainsModel, mean_gain

ONE_STEP = GainsConfig(min_steps=1, prior_scale=0.5)


def test_docstring_example() -> None:
    # own steps decide up to what they drafted (4); past it, half of each node's trie probability
    history = [((1, 2), 4), ((1,), 4)]
    got = GainsModel(ONE_STEP).expected(history, [1.0, 0.9, 0.9, 0.8, 0.8, 0.8])
    assert got == pytest.approx([1.0, 2.0, 2.5, 2.5, 2.5, 2.9, 3.3])


def test_small_trees_say_nothing_past_their_size() -> None:
    # steps that drafted 2 nodes are not evidence about budget 3
    assert mean_gain([((1, 2), 2), ((1, 2, 3), 3)], 3) == (3.0, 1)
    assert mean_gain([((1, 2), 2)], 3) == (0.0, 0)


def test_no_history_uses_the_pool_then_the_tree() -> None:
    # a new request borrows the engine's steps where they exist, the tree's confidence beyond them
    model = GainsModel(GainsConfig(min_steps=2, prior_scale=1.0))
    model.observe((1,), 1)
    model.observe((), 1)
    got = model.expected([], [0.8, 0.4])
    assert got == pytest.approx([1.0, 1.5, 1.9])


def test_curve_never_decreases() -> None:
    # a noisy own history (less accepted at a bigger budget by fewer samples) still gives a monotone curve
    history = [((1, 2, 3), 3), ((), 5), ((), 5)]
    got = GainsModel(ONE_STEP).expected(history, [1.0] * 5)
    assert all(b >= a for a, b in itertools.pairwise(got))


def test_pool_forgets_old_steps() -> None:
    # past pool_window, the oldest step's counts are taken back out
    model = GainsModel(GainsConfig(pool_window=2))
    model.observe((1, 2), 2)
    model.observe((), 2)
    model.observe((), 2)
    assert model.pooled(1) == (0.0, 2)
    assert model.pooled(2) == (0.0, 2)


def test_prefix_of_a_best_first_tree() -> None:
    # the first q nodes form a tree: parents stay inside it
    tree = DraftTree()
    a = tree.add(0, 5, prob=0.9)
    tree.add(a, 6, prob=0.8)
    tree.add(0, 7, prob=0.1)
    cut = tree.prefix(2)
    assert (cut.tokens, cut.parents, cut.depths, cut.probs) == ([5, 6], [0, 1], [1, 2], [0.9, 0.8])
    assert tree.prefix(5) is tree


def test_confident_copy_beats_the_pool() -> None:
    # the pool says budget 2 gained nothing, but this tree's second node is a confident copy (p 0.95)
    model = GainsModel(GainsConfig(min_steps=2, prior_scale=0.5, confident=0.9))
    for _ in range(4):
        model.observe((1,), 4)
    got = model.expected([], [0.95, 0.95, 0.5])
    assert got == pytest.approx([1.0, 1.95, 2.9, 2.9])
