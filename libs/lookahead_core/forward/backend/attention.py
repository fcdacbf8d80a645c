"""The device-generic backend's attention: one call per layer for every segment of a step, over the KV pool.

Registered with transformers' ``AttentionInterface`` as ``POOLED_ATTENTION``; the forward carries a
``layout.PooledStep`` in the keyword ``lookahead_plan`` (as the CPU backend's ragged attention carries its
``RaggedPlan``). Each call first writes the forward's new keys and values into their slots (one indexed
write each), then attends:

- padded layout: the query rows in a [segments, heads, rows, head_dim] block against each segment's slot
  ([segments, kv_heads, keys, head_dim]) under the step's boolean mask: one sdpa;
- canonical layout (``exact_numerics``): each row as its own batch item, [rows, heads, 1, head_dim] against
  its gathered line [rows, kv_heads, keys, head_dim]: one sdpa whose every row sees the same values in
  the same order, padded to the same length, whether it is verified in a tree or decoded alone.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from ..step_layout import PLAN_KWARG
from .layout import PooledStep

POOLED_ATTENTION = "lookahead_pooled"  # name registered with transformers' AttentionInterface


def pooled_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, T, head_dim]
    key: torch.Tensor,  # [1, kv_heads, T, head_dim] (this forward's new entries only)
    value: torch.Tensor,  # [1, kv_heads, T, head_dim]
    attention_mask: torch.Tensor | None,  # unused: what each row sees comes from the layout
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention of a forward's rows, each request over its own slot; output [1, T, heads, head_dim]."""
    step = kwargs.get(PLAN_KWARG)
    if not isinstance(step, PooledStep):
        raise RuntimeError(f"{POOLED_ATTENTION} attention needs a PooledStep in the forward's {PLAN_KWARG!r}")
    started = time.perf_counter() if step.plan.timed else 0.0
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    pool_k, pool_v = step.pool.keys[layer], step.pool.values[layer]  # each [slots + 1, kv_heads, slot_tokens, hd]
    pool_k[step.slot, :, step.at] = key[0].transpose(0, 1)  # [T, kv_heads, head_dim] into their entries
    pool_v[step.slot, :, step.at] = value[0].transpose(0, 1)
    gqa = query.shape[1] != key.shape[1]
    out = _canonical(query, pool_k, pool_v, step, scaling, gqa) if step.gather is not None else \
        _padded(query, pool_k, pool_v, step, scaling, gqa)
    if step.plan.timed:
        step.plan.attention_s += time.perf_counter() - started
    return out, None


def _padded(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, step: PooledStep,
            scaling: float | None, gqa: bool) -> torch.Tensor:
    heads, head_dim = query.shape[1], query.shape[-1]
    assert step.gather_rows is not None and step.seg_slots is not None and step.scatter_rows is not None
    segments = step.seg_slots.shape[0]
    q = query[0][:, step.gather_rows].view(heads, segments, step.rows, head_dim).transpose(0, 1)  # [S, H, Q, hd]
    if step.first_slot is not None:  # consecutive slots (the usual case: lowest free first): views, no copy
        span = slice(step.first_slot, step.first_slot + segments)
        k, v = pool_k[span, :, : step.keys], pool_v[span, :, : step.keys]  # [S, kv_heads, keys, hd]
    else:
        k = pool_k[:, :, : step.keys].index_select(0, step.seg_slots)  # [S, kv_heads, keys, hd]
        v = pool_v[:, :, : step.keys].index_select(0, step.seg_slots)
    seen = F.scaled_dot_product_attention(q, k, v, attn_mask=step.mask, scale=scaling, enable_gqa=gqa)  # [S,H,Q,hd]
    rows = seen.transpose(1, 2).reshape(segments * step.rows, heads, head_dim)  # [S * Q, heads, head_dim]
    return rows[step.scatter_rows][None]  # [1, T, heads, head_dim]


def _canonical(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, step: PooledStep,
               scaling: float | None, gqa: bool) -> torch.Tensor:
    assert step.gather is not None
    slots = step.slot[:, None]  # [T, 1]
    k = pool_k[slots, :, step.gather].transpose(1, 2)  # [T, kv_heads, keys, hd]: each row's line
    v = pool_v[slots, :, step.gather].transpose(1, 2)
    q = query[0].transpose(0, 1)[:, :, None]  # [T, heads, 1, hd]
    seen = F.scaled_dot_product_attention(q, k, v, attn_mask=step.valid, scale=scaling, enable_gqa=gqa)  # [T,H,1,hd]
    return seen.transpose(1, 2).transpose(0, 1)  # [1, T, heads, head_dim]


AttentionInterface.register(POOLED_ATTENTION, pooled_attention)
