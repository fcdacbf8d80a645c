"""MJSD's draft side and its verification (paper 004): beam search on the draft model, joint acceptance.

Each step (``MjsdProposer``):

1. **propose**: the draft's cache follows the accepted context (``DraftModelProposer.sync``); a beam
   search of ``beams`` beams and ``depth`` tokens runs on a batched copy of that cache
   (``repeat_cache`` / ``select_rows``, thrown away after the step), and the beams, best first, are
   merged into a token tree whose nodes remember the draft's log-probability of their token;
2. **accept**: the target's logits for the tree's rows give each node's target log-probability, and
   ``mjsd.joint_accept`` picks the deepest prefix whose joint likelihood passes the threshold.

Lossy by design: see mjsd.py. The bonus token after the accepted path is the target's own choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ..drafting.draft import DraftTree
from ..drafting.mjsd import joint_accept
from ..kv.draft_kv import repeat_cache, select_rows
from .base import Ask, Proposer
from .draft_model import DraftModelProposer


class MjsdProposer(Proposer):
    """One request's MJSD state: the draft, its KV cache (via a DraftModelProposer) and the last tree's
    draft log-probabilities. It owns its acceptance (``accept``: joint likelihood, lossy)."""

    needs_logits = True  # acceptance reads the target's logits rows, not only its choices

    def __init__(self, draft: PreTrainedModel, beams: int, depth: int, threshold: float) -> None:
        if beams < 1 or depth < 1:
            raise ValueError(f"MJSD needs beams >= 1 and depth >= 1, got {beams}, {depth}")
        if not 0 < threshold <= 1:
            raise ValueError(f"the MJSD threshold must be in (0, 1], got {threshold}")
        self.follower = DraftModelProposer(draft, top_k=1, depth=depth)  # its cache follows the accepted context
        self.beams = beams
        self.depth = depth
        self.threshold = threshold
        self.node_logprobs: list[float] = []  # the last tree's nodes: draft log-prob of each node's token

    @property
    def forwards(self) -> int:
        """Draft forwards run (sync and beam steps)."""
        return self.follower.forwards

    def _logprobs(self, logits: torch.Tensor, banned: frozenset[int]) -> torch.Tensor:
        lp = logits.float().log_softmax(-1)  # [..., vocab]
        if banned:
            lp[..., list(banned)] = float("-inf")  # never draft EOS: a step past it would be thrown away
        return lp

    def beam_search(self, context: Sequence[int], depth: int,
                    banned: frozenset[int] = frozenset()) -> tuple[list[list[int]], list[list[float]]]:
        """``beams`` sequences of ``depth`` tokens after ``context``, best first, and each token's draft
        log-prob. Example (beams 2, depth 2): [[a, c], [b, d]] with [[-0.1, -0.3], [-1.2, -0.1]]."""
        lp = self._logprobs(self.follower.sync(context), banned)  # [vocab]
        scores, first = lp.topk(min(self.beams, lp.shape[-1]))  # [B], [B]
        seqs = [[t] for t in first.tolist()]
        steps = [[s] for s in scores.tolist()]
        if depth == 1:
            return seqs, steps
        cache = repeat_cache(self.follower.cache, len(seqs))
        draft, device = self.follower.model, self.follower.device
        with torch.inference_mode():
            for _ in range(depth - 1):
                x = torch.tensor([[s[-1]] for s in seqs], dtype=torch.long, device=device)  # [B, 1]
                out = draft(input_ids=x, cache=cache, use_cache=True)
                self.follower.forwards += 1
                lp = self._logprobs(out.logits[:, -1], banned)  # [B, vocab]
                total = scores[:, None] + lp  # [B, vocab]: each continuation's joint log-prob
                scores, flat = total.flatten().topk(min(self.beams, total.numel()))  # [B], [B]
                rows = (flat // lp.shape[-1]).tolist()
                tokens = (flat % lp.shape[-1]).tolist()
                select_rows(cache, rows)
                picked = lp[rows, tokens].tolist()
                seqs = [[*seqs[r], t] for r, t in zip(rows, tokens, strict=True)]
                steps = [[*steps[r], p] for r, p in zip(rows, picked, strict=True)]
        return seqs, steps

    def propose(self, context: Sequence[int], budget: int, max_depth: int,
                banned: frozenset[int] = frozenset()) -> DraftTree:
        """The beams as a tree (best beam first, shared prefixes merged, ``budget`` nodes at most)."""
        tree = DraftTree()
        self.node_logprobs = []
        depth = min(self.depth, max_depth)
        if budget <= 0 or depth <= 0:
            return tree
        seqs, steps = self.beam_search(context, depth, banned)
        joint = [0.0]  # each node's draft log-likelihood from the root (node 0: the root)
        for seq, lps in zip(seqs, steps, strict=True):
            parent = 0
            for token, lp in zip(seq, lps, strict=True):
                node = tree.child(parent, token)  # a better beam's shared prefix: already there
                if node is None:
                    if len(tree) >= budget or lp == float("-inf"):  # full, or a banned token filled the beam
                        break
                    joint.append(joint[parent] + lp)
                    # prob: the draft's joint probability of the node's prefix (what budgets rank by)
                    node = tree.add(parent, token, merge=True, prob=math.exp(joint[-1]))
                    self.node_logprobs.append(lp)
                parent = node
        return tree

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        """The beams alone make the step's tree (mode mjsd drafts nothing else)."""
        tree.merge(self.propose(ask.context, ask.budget, ask.room, ask.banned))

    def accept(self, tree: DraftTree, predicted: Sequence[int], rows: torch.Tensor | None) -> list[int]:
        """The accepted path from the target's logits for the tree's rows ([1 + len(tree), vocab]: root
        first). Worked example in mjsd.py."""
        assert rows is not None, "MJSD acceptance reads the target's logits rows"
        if not len(tree):
            return [0]
        lsm = rows.float().log_softmax(-1)  # [1 + nodes, vocab]
        parents = torch.tensor(tree.parents, dtype=torch.long, device=rows.device)  # [nodes]
        tokens = torch.tensor(tree.tokens, dtype=torch.long, device=rows.device)  # [nodes]
        target = lsm[parents, tokens].tolist()  # [nodes]: each node's token given its parent's prefix
        return joint_accept(tree.parents, self.node_logprobs[: len(tree)], target, self.threshold)
