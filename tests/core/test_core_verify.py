"""accept_longest on hand-made trees, and the flattened tree inputs (ids, positions, mask)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_core.drafting.draft import DraftTree, ancestor_matrix
from lookahead_core.drafting.verify import accept_longest
from lookahead_core.engine.pack import PackedStep, pack_step
from lookahead_core.engine.plan import Decode, StepPlan
from lookahead_core.forward.ragged import segment_mask

from tests.core.helpers import tree_from

X = 99  # a token the model never predicts below: the draft is wrong there

# (parent, token) specs in flattened order; predicted[i] = the model's choice after node i (0 = root)
ACCEPT_CASES: list[tuple[list[tuple[int, int]], list[int], list[int]]] = [
    # root-only tree: nothing to verify, the path is the root (the bonus token comes from it)
    ([], [5], [0]),
    # all wrong: a chain whose first token differs from the model's choice
    ([(0, 1), (1, 2), (2, 3)], [7, 2, 3, 4], [0]),
    # all right: the whole chain is accepted
    ([(0, 1), (1, 2), (2, 3)], [1, 2, 3, 4], [0, 1, 2, 3]),
    # right then wrong: accepted up to the first mismatch
    ([(0, 1), (1, 2), (2, 3)], [1, 2, 9, 4], [0, 1, 2]),
    # fork at every depth, wrong sibling first: path 0 -> 2 -> 4 -> 6 (every other node)
    ([(0, X), (0, 1), (2, X), (2, 2), (4, X), (4, 3)], [1, 0, 2, 0, 3, 0, 8], [0, 2, 4, 6]),
    # fork at every depth, right sibling first: the prefix 0 -> 1 -> 3 -> 5
    ([(0, 1), (0, X), (1, 2), (1, X), (3, 3), (3, X)], [1, 2, 0, 3, 0, 8, 0], [0, 1, 3, 5]),
    # duplicate parallel chains "1 2 X" and "1 2 3 4": only the second leads deeper (non-contiguous path)
    ([(0, 1), (1, 2), (2, X), (0, 1), (4, 2), (5, 3), (6, 4)], [1, 2, 3, 8, 2, 3, 4, 8], [0, 4, 5, 6, 7]),
    # duplicate chains of equal accepted length: the first one wins the tie
    ([(0, 1), (1, 2), (0, 1), (3, 2)], [1, 2, 7, 2, 7], [0, 1, 2]),
    # the right token sits below a wrong parent: unreachable, only the root is accepted
    ([(0, X), (1, 1)], [1, 1, 0], [0]),
    # the deeper of two matching subtrees wins even when it comes later
    ([(0, 1), (0, 1), (2, 2), (3, 3)], [1, 2, 2, 3, 5], [0, 2, 3, 4]),
]


@pytest.mark.parametrize(("spec", "predicted", "path"), ACCEPT_CASES)
def test_accept_longest(spec: list[tuple[int, int]], predicted: list[int], path: list[int]) -> None:
    tree = tree_from(spec)
    assert accept_longest(tree.tokens, tree.parents, predicted) == path


def _valid_paths(tokens: list[int], parents: list[int], predicted: list[int]) -> list[list[int]]:
    """Brute force: every accepted root path (each node's token equals the choice at its parent)."""
    out = [[0]]
    for node in range(1, len(tokens) + 1):
        chain, cur = [], node
        while cur:
            chain.append(cur)
            cur = parents[cur - 1]
        chain = [0, *chain[::-1]]
        if all(tokens[c - 1] == predicted[p] for p, c in itertools.pairwise(chain)):
            out.append(chain)
    return out


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    n = draw(st.integers(0, 14))
    parents = [draw(st.integers(0, k)) for k in range(n)]  # node k+1's parent precedes it
    tokens = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))  # tiny alphabet: duplicates
    predicted = draw(st.lists(st.integers(0, 2), min_size=n + 1, max_size=n + 1))
    return tokens, parents, predicted


@settings(max_examples=400, deadline=None)
@given(trees())
def test_accept_longest_is_a_longest_valid_path(case: tuple[list[int], list[int], list[int]]) -> None:
    tokens, parents, predicted = case
    path = accept_longest(tokens, parents, predicted)
    valid = _valid_paths(tokens, parents, predicted)
    assert path in valid
    assert len(path) == max(len(p) for p in valid)


# ---- tree inputs -------------------------------------------------------------------------------------
INPUT_CASES: list[tuple[list[tuple[int, int]], int]] = [
    # root only (plain greedy step) on a 5-token cache
    ([], 5),
    # a chain of three on a 2-token cache
    ([(0, 11), (1, 12), (2, 13)], 2),
    # forks at two depths plus a separate chain, on a 4-token cache
    ([(0, 11), (0, 21), (1, 12), (1, 22), (3, 13), (0, 11), (6, 12)], 4),
    # a wide tree on an empty cache
    ([(0, 1), (0, 2), (0, 3), (2, 4)], 0),
]


def _ancestors_or_self(parents: list[int], node: int) -> set[int]:
    out = {node}
    while node:
        node = parents[node - 1]
        out.add(node)
    return out


def packed_tree(tree: DraftTree, root: int, past: int) -> PackedStep:
    """The engine's packed row of one request verifying ``tree`` below ``root`` over ``past`` cached entries."""
    kv = SimpleNamespace(length=past)  # never read when packing: the segment only points at it
    return pack_step(StepPlan([Decode("r", tree, len(tree), root, past, None, [], 0)], []), {"r": kv})  # type: ignore[dict-item]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("spec", "past"), INPUT_CASES)
def test_tree_inputs(spec: list[tuple[int, int]], past: int, dtype: torch.dtype) -> None:
    tree = tree_from(spec)
    q = len(tree) + 1
    step = packed_tree(tree, root=77, past=past)
    assert step.ids == [77, *tree.tokens]
    assert step.positions == [past + d for d in [0, *tree.depths]]
    assert step.keep == list(range(q)) and step.decodes[0].tree == slice(0, q)  # every node's choice is read
    mask = segment_mask(step.attention.segments[0], dtype, torch.device("cpu"))
    if q == 1:  # the root alone sees the whole cache and itself: no mask (sdpa's fastest path)
        assert mask is None
        return
    assert mask is not None and mask.shape == (1, 1, q, past + q)
    assert mask.dtype == dtype
    low = torch.finfo(dtype).min
    for i in range(q):
        visible = set(range(past)) | {past + j for j in _ancestors_or_self(tree.parents, i)}
        for col in range(past + q):
            assert mask[0, 0, i, col].item() == (0.0 if col in visible else low), (i, col)


def test_ancestor_matrix_chain_and_fork() -> None:
    # root, node 1 under root, nodes 2 and 3 under node 1
    anc = ancestor_matrix([0, 1, 1])
    assert anc.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, False, True],
    ]


def test_empty_tree_inputs_are_one_token() -> None:
    step = packed_tree(DraftTree(), root=3, past=7)
    assert step.ids == [3] and step.positions == [7] and step.keep == [0]
    assert segment_mask(step.attention.segments[0], torch.float32, torch.device("cpu")) is None  # sees all the cache
