"""The scheduler's ragged forwards, built: one step's packed row, and the start-up cost probe.

A step packs every decoding request's tree (its root first) and every prefill chunk into one row;
each becomes a ``Segment`` of the ``RaggedPlan`` that ragged attention follows (ragged.py). The
probe runs forwards of n prompt-like tokens the same way, so the measured cost curve is what steps
cost on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .draft import DraftTree
from .jacobi_branch import branch_ids_positions, visible_with_branch
from .kvstore import KVShape, RequestKV
from .ragged import PLAN_KWARG, RaggedPlan, Segment, causal_visible
from .serve_request import ServeRequest
from .tree_inputs import ancestor_matrix

Chunk = tuple[ServeRequest, int, int]  # (request, first, end): prompt positions [first, end) prefilled this step


@dataclass
class PackedStep:
    """One step's forward: the decoding requests' trees first (in order), then the prompt chunks."""

    ids: list[int] = field(default_factory=list)  # [T] token ids of the packed row
    positions: list[int] = field(default_factory=list)  # [T] each token's position in its own request
    keep: list[int] = field(default_factory=list)  # [K] packed positions whose logits the step needs
    plan: RaggedPlan = field(default_factory=RaggedPlan)  # where each request's tokens sit, what they see


def pack_step(decoding: Sequence[ServeRequest], trees: Sequence[DraftTree], chunks: Sequence[Chunk]) -> PackedStep:
    """Pack the trees (every node's logits kept), each followed by its request's Jacobi window (the last
    row's logits kept), and the chunks (only a prompt's last token's logits: they give the first output
    token) into one row."""
    step = PackedStep()
    for req, tree in zip(decoding, trees, strict=True):
        assert req.kv is not None
        start = len(step.ids)
        step.ids += [req.root(), *tree.tokens]
        step.positions += [req.kv.length + d for d in (0, *tree.depths)]
        step.keep += range(start, len(step.ids))
        if req.branch is None:
            visible = ancestor_matrix(tree.parents)  # [q, q]
        else:
            q = len(tree) + 1
            ids, positions = branch_ids_positions(req.branch.window, req.kv.length)
            visible = visible_with_branch(tree.parents, req.branch.window)  # [q+L, q+L]
            step.ids += ids
            step.positions += positions
            last = req.branch.last_row(q)
            step.keep += range(start + last.start, start + last.stop)
        step.plan.segments.append(Segment(req.kv, start, req.kv.length, visible))
    for req, first, end in chunks:
        assert req.kv is not None
        start = len(step.ids)
        step.ids += req.prompt_ids[first:end]
        step.positions += range(first, end)
        step.plan.segments.append(Segment(req.kv, start, first, causal_visible(end - first)))
        if end == len(req.prompt_ids):
            step.keep.append(len(step.ids) - 1)  # the last prompt token's logits give the first output token
    return step


def choose_step(
    logits: torch.Tensor, decoding: Sequence[ServeRequest], trees: Sequence[DraftTree], chunks: Sequence[Chunk]
) -> list[int]:
    """The token chosen after each kept row of ``pack_step``'s forward ([K, vocab] logits -> [K] ids);
    a request's Jacobi rows get their greedy guess.

    Each request's rows go through its own chooser (its processors, its seed); when every request is
    greedy without processors, one argmax over the whole row does it.
    """
    finishing = [req for req, _first, end in chunks if end == len(req.prompt_ids)]
    choosers = [req.chooser for req in (*decoding, *finishing)]
    if all(c is not None and c.plain for c in choosers) and all(r.beams is None for r in decoding):
        return logits.argmax(-1).tolist()  # [K]
    out: list[int] = []
    at = 0
    for req, tree in zip(decoding, trees, strict=True):
        assert req.chooser is not None
        n = len(tree) + 1
        out += req.chooser.choose(logits[at : at + n], req.context(), tree.parents, tree.tokens, len(req.output))
        if req.beams is not None:  # mode mjsd accepts by joint likelihood: it needs the rows themselves
            req.judge(logits[at : at + n], tree)
        at += n
        if req.branch is not None:  # the window's guesses are greedy whatever the request samples
            w = req.branch.config.window
            out += logits[at : at + w].argmax(-1).tolist()  # [W]
            at += w
    for req in finishing:
        assert req.chooser is not None
        out += req.chooser.choose(logits[at : at + 1], req.prompt_ids, position=0)
        at += 1
    return out


class RaggedProbe:
    """``probe(runner, n)``: one ragged forward of ``n`` prompt-like tokens over ``past`` cached entries.

    Pass it to ``KernelSet.calibrate``: every kernel twin is timed on the scheduler's own kind of forward.
    """

    def __init__(self, shape: KVShape, past: int) -> None:
        self.shape = shape
        self.past = past  # cache entries behind the timed forwards

    def __call__(self, runner: torch.nn.Module, n: int) -> None:
        past, device = self.past, self.shape.device
        kv = RequestKV(self.shape, past + n)
        kv.length = past
        plan = RaggedPlan([Segment(kv, 0, past, causal_visible(n))])
        plan.finalize(self.shape.dtype, device)
        with torch.inference_mode():
            ids = torch.zeros(1, n, dtype=torch.long, device=device)  # [1, n]
            pos = torch.arange(past, past + n, device=device)[None]  # [1, n]
            keep = torch.arange(n, device=device)  # [n]: every position, like a tree
            runner(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep, **{PLAN_KWARG: plan})
