"""Tree attention on a real forward: every node's logits equal a linear run of its own branch (fp32)."""

from __future__ import annotations

import pytest
import torch
from lookahead_core.attention import tree_attention
from lookahead_core.kernels import make_twin
from lookahead_core.tree_inputs import build_tree_inputs
from transformers import DynamicCache

from tests.core.helpers import ATTNS, FAMILIES, node_paths, tiny_model, tree_from

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [11, 200, 37, 37, 91, 4, 150, 66, 12, 9]
ROOT = 42  # the last emitted token: not in the cache yet, tree depth 0

# Forks at depths 1, 2 and 3, a lone deep chain, and a duplicate of an earlier branch (same tokens,
# later in the flattened order: must give the same logits).
TREE = [
    (0, 10),  # 1: depth 1
    (0, 20),  # 2: depth 1 (fork at depth 1)
    (0, 30),  # 3: depth 1
    (1, 11),  # 4: depth 2
    (1, 12),  # 5: depth 2 (fork at depth 2)
    (4, 13),  # 6: depth 3
    (4, 14),  # 7: depth 3 (fork at depth 3)
    (2, 21),  # 8: depth 2
    (8, 22),  # 9: depth 3
    (9, 23),  # 10: depth 4
    (10, 24),  # 11: depth 5
    (0, 10),  # 12: duplicate of node 1
    (12, 11),  # 13: duplicate of node 4
]


def linear_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """Plain causal forward, no cache, last position's logits [vocab]."""
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0, -1]


def tree_logits(runner: torch.nn.Module, past_tokens: list[int], positions: bool = True) -> torch.Tensor:
    """Prefill ``past_tokens`` into a cache, then one tree forward; logits [q, vocab].

    ``positions=False`` leaves position_ids out (the model then numbers the tree consecutively).
    """
    tree = tree_from(TREE)
    with torch.inference_mode():
        cache = DynamicCache()
        runner(torch.tensor([past_tokens]), past_key_values=cache, use_cache=True)
        inputs = build_tree_inputs(tree, ROOT, len(past_tokens), torch.float32, "cpu")
        extra = {"position_ids": inputs.position_ids} if positions else {}
        out = runner(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            past_key_values=cache,
            use_cache=True,
            **extra,
        ).logits  # [1, q, vocab]
        assert cache.get_seq_length() == len(past_tokens) + len(tree) + 1
    return out[0]


@pytest.mark.parametrize("packed", [False, True], ids=["stock", "packed"])
@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tree_node_matches_its_linear_branch(family: str, attn: str, packed: bool) -> None:
    model = tiny_model(family, attn)
    runner = make_twin(model, packed=True, attn_implementation=tree_attention(model)) if packed else model
    got = tree_logits(runner, PROMPT)
    tree = tree_from(TREE)
    branches = [[], *node_paths(tree)]  # node 0 is the root itself
    assert got.shape[0] == len(branches)
    for node, branch in enumerate(branches):
        want = linear_logits(model, [*PROMPT, ROOT, *branch])
        torch.testing.assert_close(got[node], want, rtol=0, atol=1e-4, msg=f"node {node} branch {branch}")
    # the check has teeth: different branches really give different logits
    assert not torch.allclose(got[1], got[2], atol=1e-3)
    assert torch.allclose(got[1], got[12], atol=1e-5) and torch.allclose(got[4], got[13], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_matter(family: str) -> None:
    """Consecutive positions (the default without position_ids) give wrong logits for deep nodes."""
    model = tiny_model(family)
    bad = tree_logits(model, PROMPT, positions=False)
    want = linear_logits(model, [*PROMPT, ROOT, *node_paths(tree_from(TREE))[-1]])
    assert not torch.allclose(bad[-1], want, atol=1e-4)
