"""The engine's tree forward (packed row, ragged attention over the request's KV): every node's logits equal
a linear run of its own branch (fp32)."""

from __future__ import annotations

import pytest
import torch
from lookahead_core.engine.pack import pack_step
from lookahead_core.engine.plan import Decode, StepPlan
from lookahead_core.forward.kernels import KernelSet
from lookahead_core.forward.ragged import RAGGED_ATTENTION, RaggedPlan
from lookahead_core.forward.step_layout import PLAN_KWARG, Segment, causal_visible
from lookahead_core.kv.kvstore import KVShape, RequestKV

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


def ragged(runner: torch.nn.Module, ids: list[int], positions: list[int] | None, plan: RaggedPlan,
           keep: list[int]) -> torch.Tensor:
    """One engine forward through ``runner``: logits of the ``keep`` rows [K, vocab]."""
    plan.finalize(torch.float32, torch.device("cpu"))
    extra = {"position_ids": torch.tensor([positions])} if positions is not None else {}
    with torch.inference_mode():
        return runner(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=torch.tensor(keep),
                      **extra, **{PLAN_KWARG: plan}).logits[0]


def tree_logits(runner: torch.nn.Module, past_tokens: list[int], positions: bool = True) -> torch.Tensor:
    """Prefill ``past_tokens`` into a request's KV, then one packed tree forward; logits [q, vocab].

    ``positions=False`` leaves position_ids out (the model then numbers the tree consecutively).
    """
    tree = tree_from(TREE)
    past = len(past_tokens)
    kv = RequestKV(KVShape.of(runner), past + len(tree) + 1)
    prefill = RaggedPlan([Segment(kv, 0, 0, causal_visible(past))])
    ragged(runner, past_tokens, list(range(past)), prefill, [past - 1])
    kv.length = past
    step = pack_step(StepPlan([Decode("r", tree, len(tree), ROOT, past, None, [], 0)], []), {"r": kv})
    plan = RaggedPlan.of(step.attention, torch.float32, torch.device("cpu"))  # what the CPU backend runs
    out = ragged(runner, step.ids, step.positions if positions else None, plan, step.keep)
    assert out.shape[0] == len(tree) + 1
    return out


def twin(model: torch.nn.Module, packed: bool) -> torch.nn.Module:
    """The engine's twin of ``model`` (its ragged attention; oneDNN-packed Linear layers or stock)."""
    kernel = "packed" if packed else "stock"
    return KernelSet(model, RAGGED_ATTENTION, (kernel,)).twins[kernel]


@pytest.mark.parametrize("packed", [False, True], ids=["stock", "packed"])
@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tree_node_matches_its_linear_branch(family: str, attn: str, packed: bool) -> None:
    model = tiny_model(family, attn)
    got = tree_logits(twin(model, packed), PROMPT)
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
    bad = tree_logits(twin(model, packed=False), PROMPT, positions=False)
    want = linear_logits(model, [*PROMPT, ROOT, *node_paths(tree_from(TREE))[-1]])
    assert not torch.allclose(bad[-1], want, atol=1e-4)
