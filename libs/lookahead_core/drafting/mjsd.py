"""Joint-likelihood acceptance of multi-token joint speculative decoding (MJSD, paper 004): pure.

MJSD is **lossy**: a draft prefix is accepted when the target finds it about as likely, as a whole, as
the draft did, not when each token is the target's own greedy choice. Its output may differ from plain
decoding; it runs only when asked for by name (``DraftMode.MJSD``) and its stats say so.

The beams of a draft model's beam search are merged into a token tree (node k+1: ``tokens[k]`` under
``parents[k]``; node 0 is the root, the last accepted token). For the prefix x_1..x_i ending at a node:

    passes  <=>  min(1, P_target(x_1..x_i) / P_draft(x_1..x_i)) >= threshold
            <=>  log P_target(x_1..x_i) - log P_draft(x_1..x_i) >= log(threshold)

and the deepest passing node wins (the paper's "longest draft sub-sequence that passes"; a prefix of
it need not pass on its own), ties going to the higher target likelihood, then the earlier node. The
target's own next token after it follows as a bonus, so every step emits at least one token.

Worked example (threshold 0.1, log 0.1 = -2.30): chain a -> b under the root, draft log-probs per
token (-0.1, -0.2), target (-0.5, -3.0). Cumulative: node 1 draft -0.1, target -0.5 (gap -0.4: passes);
node 2 draft -0.3, target -3.5 (gap -3.2: fails). Accepted path: [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..config import MJSD_THRESHOLD


def cumulative(parents: Sequence[int], step_logprobs: Sequence[float]) -> list[float]:
    """Each node's log-likelihood from the root: its own token's log-prob plus its parent's total.

    Parents come before children (``parents[k] <= k``), as in every DraftTree.
    Example: parents (0, 1, 0), steps (-1.0, -2.0, -0.5) -> (-1.0, -3.0, -0.5).
    """
    total = [0.0]  # node 0: the root
    for parent, lp in zip(parents, step_logprobs, strict=True):
        if parent >= len(total):
            raise ValueError(f"node {len(total)}'s parent {parent} comes after it")
        total.append(total[parent] + lp)
    return total[1:]


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root (0) down to ``node``. Example: parents (0, 1, 0), node 2 -> [0, 1, 2]."""
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1] - 1])
    return path[::-1]


def joint_accept(
    parents: Sequence[int],
    draft_logprobs: Sequence[float],
    target_logprobs: Sequence[float],
    threshold: float = MJSD_THRESHOLD,
) -> list[int]:
    """The accepted path (node indices, root first) by joint likelihood; ``[0]`` when no prefix passes.

    ``draft_logprobs`` / ``target_logprobs``: each node's token's log-probability under the draft and
    the target, given its parent's prefix (per token, not cumulative). ``threshold`` in (0, 1]: 1 accepts
    only prefixes the target likes at least as much as the draft did.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"the MJSD threshold must be in (0, 1], got {threshold}")
    if not (len(parents) == len(draft_logprobs) == len(target_logprobs)):
        raise ValueError("parents, draft and target log-probs must have one entry per node")
    floor = math.log(threshold)
    draft = cumulative(parents, draft_logprobs)
    target = cumulative(parents, target_logprobs)
    depth = [0]
    for parent in parents:
        depth.append(depth[parent] + 1)
    best, best_key = 0, (0, 0.0)
    for node in range(1, len(parents) + 1):
        if target[node - 1] - draft[node - 1] < floor:
            continue
        key = (depth[node], target[node - 1])
        if key > best_key:  # strictly better: the earlier node keeps a tie
            best, best_key = node, key
    return path_to(parents, best)
