"""Tree attention through transformers' AttentionInterface (its extension point; no patching).

Stock sdpa copies grouped-query K/V heads (``repeat_kv``) whenever a mask is given and more than
one query is in flight, which is every verification forward. ``tree_sdpa`` hands the mask and the
un-expanded K/V to ``scaled_dot_product_attention(enable_gqa=True)`` instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

TREE_SDPA = "lookahead_tree_sdpa"  # name registered with transformers' AttentionInterface


def tree_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [b, heads, q, head_dim]
    key: torch.Tensor,  # [b, kv_heads, past+q, head_dim]
    value: torch.Tensor,  # [b, kv_heads, past+q, head_dim]
    attention_mask: torch.Tensor | None,  # [b, 1, q, past+q] additive float, or None
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """sdpa over grouped K/V heads with an explicit (tree) mask; output [b, q, heads, head_dim]."""
    gqa = query.shape[1] != key.shape[1]
    causal = attention_mask is None and query.shape[2] > 1 and query.shape[2] == key.shape[2]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=gqa,
    )  # out: [b, heads, q, head_dim]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_SDPA, tree_sdpa)


def tree_attention(model: torch.nn.Module) -> str | None:
    """The attention a tree-verification twin of ``model`` runs: TREE_SDPA for sdpa models, else None (its own)."""
    return TREE_SDPA if getattr(model.config, "_attn_implementation", None) == "sdpa" else None
