"""After a packed step's one forward (its backend's ``run``): the token chosen after every kept row."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..sampling.chooser import TokenChooser
from .pack import PackedStep
from .plan import StepPlan


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
