"""Flatten a draft tree into model inputs: ids, depth-based positions and an ancestor-only mask."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .draft import DraftTree


@dataclass
class TreeInputs:
    """One verification forward's inputs (q = 1 root + len(tree) draft tokens)."""

    input_ids: torch.Tensor  # [1, q]
    position_ids: torch.Tensor  # [1, q]: past_len + depth (root depth 0)
    attention_mask: torch.Tensor  # [1, 1, q, past_len + q]: additive float, 0 = attend, min = masked


def ancestor_matrix(parents: list[int]) -> np.ndarray:
    """anc[i, j] = node j is node i or one of its ancestors; node 0 is the root.

    ``parents[k]`` is the parent of node k+1 and is always < k+1.
    """
    q = len(parents) + 1
    anc = np.zeros((q, q), dtype=bool)  # anc: [q, q]
    anc[0, 0] = True
    for i, parent in enumerate(parents, start=1):
        anc[i] = anc[parent]
        anc[i, i] = True
    return anc


def build_tree_inputs(
    tree: DraftTree, root_token: int, past_len: int, dtype: torch.dtype, device: torch.device | str
) -> TreeInputs:
    """Inputs for verifying ``tree`` below ``root_token`` on top of a cache of ``past_len`` tokens.

    The mask is additive float (0 / dtype min) because eager attention adds it to the scores
    (a bool mask there is silently wrong) and sdpa accepts the same float mask.
    """
    q = len(tree) + 1
    ids = torch.tensor([[root_token, *tree.tokens]], dtype=torch.long, device=device)  # [1, q]
    depths = torch.tensor([0, *tree.depths], dtype=torch.long, device=device)
    positions = (past_len + depths).unsqueeze(0)  # [1, q]
    anc = torch.from_numpy(ancestor_matrix(tree.parents)).to(device)  # [q, q] bool
    visible = torch.cat([torch.ones(q, past_len, dtype=torch.bool, device=device), anc], dim=1)  # [q, past+q]
    mask = torch.zeros(q, past_len + q, dtype=dtype, device=device)  # [q, past+q]
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return TreeInputs(ids, positions, mask[None, None])  # mask: [1, 1, q, past+q]
