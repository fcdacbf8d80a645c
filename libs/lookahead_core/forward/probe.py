"""The start-up cost probe: forwards of n prompt-like tokens the way a step runs them.

Pass it to ``KernelSet.calibrate``: every kernel twin is timed on the engine's own kind of forward, so the
measured cost curve is what steps cost on this machine.
"""

from __future__ import annotations

import torch

from ..kv.kvstore import KVShape, RequestKV
from .ragged import RaggedPlan
from .step_layout import PLAN_KWARG, Segment, causal_visible


class RaggedProbe:
    """``probe(runner, n)``: one ragged forward of ``n`` prompt-like tokens over ``past`` cached entries.

    Pass it to ``KernelSet.calibrate``: every kernel twin is timed on the scheduler's own kind of forward.
    """

    def __init__(self, shape: KVShape, past: int, dtype: torch.dtype | None = None) -> None:
        self.shape = shape
        self.past = past  # cache entries behind the timed forwards
        self.dtype = dtype or shape.dtype  # the model's (its masks'), where the cache holds another

    def __call__(self, runner: torch.nn.Module, n: int) -> None:
        past, device = self.past, self.shape.device
        kv = RequestKV(self.shape, past + n)
        for buf in (*kv.keys, *kv.values):
            buf.zero_()  # the buffers come uninitialised: NaNs or denormals there would time another forward
        kv.length = past
        plan = RaggedPlan([Segment(kv, 0, past, causal_visible(n))])
        plan.finalize(self.dtype, device)
        with torch.inference_mode():
            ids = torch.zeros(1, n, dtype=torch.long, device=device)  # [1, n]
            pos = torch.arange(past, past + n, device=device)[None]  # [1, n]
            keep = torch.arange(n, device=device)  # [n]: every position, like a tree
            runner(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep, **{PLAN_KWARG: plan})
