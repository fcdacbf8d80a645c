"""Ragged batched attention: several requests' tokens in one row, each attending to its own KV.

Why one ragged row rather than padded batch rows (bench/README.md, "Packing"): the Linear layers,
most of a forward's cost on CPU, then see exactly the tokens that are drafted (no padding to the
largest tree), and attention is computed per request over that request's own cache (a block-
diagonal mask over one shared pool would make every token attend over every request's entries).

``ragged_attention`` is registered with transformers' ``AttentionInterface`` (its extension
point; nothing is patched). The model runs with ``use_cache=False`` and receives a ``RaggedPlan``
as the keyword argument ``lookahead_plan``; transformers passes it through to every attention
call. For each segment the attention writes the new keys/values into the request's ``RequestKV``
at the segment's offset and runs sdpa over the request's entries with the segment's mask.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from .attend import attend_segments, invariant_rows, multi_row
from .step_layout import PLAN_KWARG, Segment, StepLayout

RAGGED_ATTENTION = "lookahead_ragged"  # name registered with transformers' AttentionInterface
INVARIANT_ATTR = "lookahead_weights"  # a model config's mark of the block kernel (quant.load.CONFIG_ATTR): its
# attention runs every forward, one-token ones too, by the one kernel whose rows do not depend on their forward


@dataclass
class RaggedPlan(StepLayout):
    """The CPU backend's attention metadata: a step's layout and its masks (built once per forward)."""

    masks: list[torch.Tensor | None] = field(default_factory=list)  # per segment: [1, 1, q, past+q] or None
    visible: list[torch.Tensor] = field(default_factory=list)  # per segment: [q, q] bool (the kernel's mask)

    @classmethod
    def of(cls, layout: StepLayout, dtype: torch.dtype, device: torch.device) -> RaggedPlan:
        """``layout``'s plan with its masks (what its attention spends is added to ``layout`` by the caller)."""
        plan = cls(layout.segments, layout.timed)
        plan.finalize(dtype, device)
        return plan

    def finalize(self, dtype: torch.dtype, device: torch.device) -> None:
        """Additive float masks (0 attend / dtype min) for every segment that needs one (sdpa's), and every
        segment's visibility as a tensor (``attend.multi_row``'s)."""
        self.masks = [segment_mask(s, dtype, device) for s in self.segments]
        self.visible = [torch.from_numpy(np.ascontiguousarray(s.visible)).to(device) for s in self.segments]


def segment_mask(seg: Segment, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """[1, 1, q, past+q] additive mask of a segment; None when every token sees everything before it.

    A single token sees the whole cache, so it needs no mask (sdpa's fastest path).
    """
    if seg.q == 1:
        return None
    mask = torch.zeros(seg.q, seg.past + seg.q, dtype=dtype, device=device)  # [q, past+q]
    hidden = torch.from_numpy(~seg.visible).to(device)  # [q, q] bool
    mask[:, seg.past :].masked_fill_(hidden, torch.finfo(dtype).min)
    return mask[None, None]  # [1, 1, q, past+q]


def ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, T, head_dim]
    key: torch.Tensor,  # [1, kv_heads, T, head_dim] (this forward's new entries only)
    value: torch.Tensor,  # [1, kv_heads, T, head_dim]
    attention_mask: torch.Tensor | None,  # unused: masks come from the plan
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed row, each request over its own cache; output [1, T, heads, head_dim]. A forward of
    several rows runs every segment by ``attend.multi_row``'s kernel where it is kept and takes the queries
    (fp32 on the CPU: ``placement``; a CUDA or half-precision model keeps sdpa), a one-token forward by sdpa
    (plain greedy's bits); a model on the block kernel runs every forward by that kernel (width-invariant)."""
    plan = kwargs.get(PLAN_KWARG)
    if not isinstance(plan, RaggedPlan):
        raise RuntimeError(f"{RAGGED_ATTENTION} attention needs a RaggedPlan in the forward's {PLAN_KWARG!r}")
    started = time.perf_counter() if plan.timed else 0.0
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    heads, head_dim = query.shape[1], query.shape[-1]
    if getattr(module.config, INVARIANT_ATTR, ""):  # on the block kernel: every forward by one kernel, one row too
        fast = invariant_rows(head_dim, query.device, query.dtype)
    else:
        fast = multi_row(head_dim, query.device, query.dtype) if query.shape[2] > 1 else None
    out = query.new_empty(1, query.shape[2], heads, head_dim)  # [1, T, heads, head_dim]
    for seg in plan.segments:
        end = seg.start + seg.q
        seg.kv.write(layer, seg.past, key[:, :, seg.start : end], value[:, :, seg.start : end])
    if fast is not None:  # a forward of several rows: every segment by the kernel, in one call
        spans = [slice(seg.start, seg.start + seg.q) for seg in plan.segments]
        attend_segments(fast, [query[:, :, rows].contiguous() for rows in spans],
                        [seg.kv.keys[layer] for seg in plan.segments],
                        [seg.kv.values[layer] for seg in plan.segments], [seg.past for seg in plan.segments],
                        plan.visible, scaling if scaling is not None else head_dim**-0.5,
                        [out[0, rows].view(-1, heads * head_dim) for rows in spans])
    else:
        for seg, mask in zip(plan.segments, plan.masks, strict=True):
            k, v = seg.kv.view(layer, seg.past + seg.q)  # [1, kv_heads, past+q, head_dim]
            out[:, seg.start : seg.start + seg.q] = F.scaled_dot_product_attention(
                query[:, :, seg.start : seg.start + seg.q], k, v, attn_mask=mask, scale=scaling,
                enable_gqa=heads != key.shape[1]).transpose(1, 2)  # [1, q, heads, head_dim]
    if plan.timed:
        plan.attention_s += time.perf_counter() - started
    return out, None


AttentionInterface.register(RAGGED_ATTENTION, ragged_attention)
