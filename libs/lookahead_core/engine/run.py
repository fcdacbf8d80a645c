"""Run a packed step: one forward over the packed row, then the token chosen after every kept row."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..forward.ragged import PLAN_KWARG
from ..sampling.chooser import TokenChooser
from .pack import PackedStep
from .plan import StepPlan


def forward(runner: nn.Module, step: PackedStep, device: torch.device) -> torch.Tensor:
    """The kept rows' logits of one forward of ``step`` through ``runner``: [K, vocab] (its attention masks
    were built by ``pack_step``)."""
    with torch.inference_mode():
        input_ids = torch.tensor([step.ids], dtype=torch.long, device=device)  # [1, T]
        position_ids = torch.tensor([step.positions], dtype=torch.long, device=device)  # [1, T]
        keep = torch.tensor(step.keep, dtype=torch.long, device=device)  # [K]
        logits = runner(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=keep,
            **{PLAN_KWARG: step.attention},
        ).logits  # [1, K, vocab]
    return logits[0]  # [K, vocab]


def choose(logits: torch.Tensor, plan: StepPlan, step: PackedStep, choosers: Mapping[str, TokenChooser]) -> list[int]:
    """The token chosen after each kept row ([K, vocab] -> [K] ids); ``choosers``: each request's, by id.

    Each request's tree rows go through its own chooser (its processors, its seed); extra rows get the
    greedy guess whatever the request samples; when every chooser is plain greedy, one argmax does it.
    """
    finishing = [c.id for c in plan.chunks if c.last]
    if all(choosers[i].plain for i in [*(d.id for d in plan.decodes), *finishing]):
        return logits.argmax(-1).tolist()  # [K]
    out = logits.argmax(-1).tolist()  # [K]: greedy everywhere, then each chooser's rows replaced
    for d, rows in zip(plan.decodes, step.decodes, strict=True):
        tree = d.tree
        out[rows.tree] = choosers[d.id].choose(logits[rows.tree], d.context, tree.parents, tree.tokens, d.emitted)
    for c, row in zip(plan.chunks, step.first_rows, strict=True):
        if row is not None:
            out[row] = choosers[c.id].choose(logits[row : row + 1], c.prompt, position=0)[0]
    return out
