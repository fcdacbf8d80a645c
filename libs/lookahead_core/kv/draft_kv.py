"""Edits of a draft model's DynamicCache (rollback to the accepted text, beam search's copies and reorders):
the only code that changes such a cache outside the model. The engine's own cache is ``kvstore``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Cache, DynamicCache


def _layers(cache: Cache) -> list:
    layers = cache.layers
    return [lay for lay in layers if getattr(lay, "is_initialized", True) and lay.keys is not None]


def rollback_cache(cache: Cache, length: int) -> None:
    """Cut every layer back to ``length`` tokens.

    A forward that raised part-way leaves earlier layers longer than later ones (and
    ``get_seq_length`` reads layer 0 only), so every layer is restored, not just the first.
    """
    for layer in _layers(cache):
        if layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]  # keys: [b, kv_heads, length, head_dim]
            layer.values = layer.values[..., :length, :]


def repeat_cache(cache: Cache, n: int) -> DynamicCache:
    """A new cache holding ``n`` copies of a batch-1 ``cache`` (beam search's start); ``cache`` is untouched."""
    if n < 1:
        raise ValueError(f"repeat_cache needs n >= 1, got {n}")
    out = DynamicCache()
    for i, layer in enumerate(_layers(cache)):
        if layer.keys.shape[0] != 1:
            raise ValueError(f"repeat_cache wants a batch-1 cache, got batch {layer.keys.shape[0]}")
        # keys: [1, kv_heads, length, head_dim] -> [n, kv_heads, length, head_dim]
        out.update(layer.keys.repeat(n, 1, 1, 1), layer.values.repeat(n, 1, 1, 1), i)
    return out


def select_rows(cache: Cache, rows: Sequence[int]) -> None:
    """Keep the batch rows ``rows`` in this order (repeats allowed): beam search's reorder, in place."""
    index = torch.tensor(list(rows), dtype=torch.long)
    for layer in _layers(cache):
        idx = index.to(layer.keys.device)
        layer.keys = layer.keys.index_select(0, idx)  # keys: [b, kv_heads, length, head_dim] -> [len(rows), ...]
        layer.values = layer.values.index_select(0, idx)
