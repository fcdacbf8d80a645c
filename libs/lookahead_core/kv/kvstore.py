"""One request's KV cache in the serving engine: preallocated per-layer buffers written in place.

The batched forward packs many requests into one row; the ragged attention (ragged.py) writes each
request's new keys/values straight into its own buffers at explicit offsets and attends over a
view of them. Nothing is concatenated per step (DynamicCache's ``torch.cat`` would copy every
request's whole cache every step), and entries beyond ``length`` are garbage that no mask ever
shows. Every edit of the cache outside the model is one of the explicit functions below.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# per layer (keys, values): [1, kv_heads, n, head_dim] (the prefix cache's exchange format)
KV = list[tuple[torch.Tensor, torch.Tensor]]
# a cached prefix as the prefix cache holds it: (first token, per-layer [1, kv_heads, length, head_dim] views),
# in token order, tiling [0, n)
Pieces = list[tuple[int, KV]]


@dataclass(frozen=True)
class KVShape:
    """What one cache entry looks like for a model."""

    layers: int  # decoder layers
    kv_heads: int  # key/value heads per layer
    head_dim: int  # size of one head
    dtype: torch.dtype  # cache dtype (the model's, or half where every forward attends by the kernel)
    device: torch.device  # where the buffers live

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @classmethod
    def of(cls, model: torch.nn.Module) -> KVShape:
        """The cache shape of a Hugging Face decoder-only model."""
        cfg = model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        param = next(model.parameters())
        return cls(cfg.num_hidden_layers, kv_heads, head_dim, param.dtype, param.device)


def allocate(size: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised tensor of ``size`` for a request's cache. On the CPU it is a mapping of its own (anonymous
    ``mmap``), unmapped when the tensor goes, so the request's end gives its pages back to the system: from malloc's
    heap, a freed cache of tens of MB would stay resident on its free lists (glibc raises its mmap threshold to
    each freed block's size), measured as +200-500 MB of resident memory after 48 requests at 16 clients."""
    count = math.prod(size)
    if torch.device(device).type != "cpu" or count == 0:
        return torch.empty(size, dtype=dtype, device=device)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # anonymous, private: zero pages until written
    return torch.frombuffer(pages, dtype=dtype, count=count).view(size)  # the tensor keeps the mapping alive


class RequestKV:
    """Keys/values of one request: ``length`` valid entries per layer, room for ``capacity``."""

    def __init__(self, shape: KVShape, capacity: int) -> None:
        self.shape = shape
        self.capacity = capacity
        self.length = 0  # valid entries (same in every layer between forwards)
        # one allocation for the request: [2 (keys, values), layers, 1, kv_heads, capacity, head_dim]
        self.buffer = allocate((2, shape.layers, 1, shape.kv_heads, capacity, shape.head_dim), shape.dtype,
                               shape.device)
        self.keys = list(self.buffer[0].unbind(0))  # per layer [1, kv_heads, capacity, head_dim], contiguous views
        self.values = list(self.buffer[1].unbind(0))

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers (capacity, not length)."""
        return self.capacity * self.shape.bytes_per_token

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put ``q`` new entries at ``start`` (keys/values: [1, kv_heads, q, head_dim])."""
        end = start + keys.shape[-2]
        if end > self.capacity:
            raise ValueError(f"KV overflow: {end} entries > capacity {self.capacity}")
        self.keys[layer][:, :, start:end] = keys
        self.values[layer][:, :, start:end] = values

    def view(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` entries of a layer (no copy): two [1, kv_heads, n, head_dim] views."""
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]


def compact(kv: RequestKV, past_len: int, keep: Sequence[int]) -> None:
    """After a tree forward at ``past_len``: keep the accepted entries (tree indices, ascending).

    The tree's entries sit at ``past_len + i``; the accepted path's are not contiguous, so they
    are gathered into ``[past_len, past_len + len(keep))``. ``length`` becomes that end.
    """
    n = len(keep)
    if list(keep) != list(range(n)):
        idx = torch.tensor([past_len + i for i in keep], dtype=torch.long, device=kv.shape.device)  # [n]
        for layer in range(kv.shape.layers):
            for buf in (kv.keys[layer], kv.values[layer]):
                buf[:, :, past_len : past_len + n] = buf.index_select(2, idx)  # [1, kv_heads, n, head_dim]
    kv.length = past_len + n


def load_prefix(kv: RequestKV, pieces: Pieces, n: int) -> None:
    """Copy a cached prefix of ``n`` entries, held in ``pieces``, into an empty request cache."""
    if n > kv.capacity:
        raise ValueError(f"prefix of {n} entries > capacity {kv.capacity}")
    at = 0
    for start, part in pieces:
        length = part[0][0].shape[-2]
        if start != at:
            raise ValueError(f"prefix pieces leave a gap or overlap at token {at} (next piece starts at {start})")
        for layer, (keys, values) in enumerate(part):
            kv.keys[layer][:, :, start : start + length] = keys  # [1, kv_heads, length, head_dim]
            kv.values[layer][:, :, start : start + length] = values
        at = start + length
    if at != n:
        raise ValueError(f"prefix pieces hold {at} entries, not {n}")
    kv.length = n


def prefix_views(kv: RequestKV, n: int) -> KV:
    """Views of the first ``n`` entries (for the prefix cache, which copies the part it keeps)."""
    return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(kv.keys, kv.values, strict=True)]  # [1, kv_heads, n, head_dim]
