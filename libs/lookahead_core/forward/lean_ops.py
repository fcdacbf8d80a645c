"""The lean loop's small steps between products, two ways: the stock operations, or ``lean_ops.cpp``.

Between its products a layer makes ~40 small ATen calls (two RMSNorms of six each, the rotary
embedding's fourteen, the cache writes, the residual adds), each a few microseconds of dispatch for a
few hundred floats a token. ``FusedOps`` makes them in two C++ calls a step (``add_rms_norm``,
``rotary_into_cache``) with the same arithmetic; the only reduction, the norm's sum of squares, is
summed in ATen's cascade order over vectors of ``lanes`` floats (8 in torch's AVX2 and AVX512 sum
kernels). ``StockOps`` makes the stock calls themselves. ``lean.lean_ops`` offers the first that gives
the stock forward's bits on the loaded model (``candidates``: fused with 8 lanes, with 16, then stock).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import torch

from ..kv.kvstore import RequestKV
from .cext import build
from .placement import check, check_cache

SOURCE = "lean_ops.cpp"  # the fused steps (C++), beside this module
EXTENSION = "lookahead_lean_ops"  # its module name in torch's extension cache
FLAGS = ("-O3", "-ffp-contract=off")  # no FMA: every product rounded before it is added, as ATen's are
LANES = (8, 16)  # vector widths ATen's sum kernel may use (AVX2 / AVX512 floats)

Rotary = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # the modeling module's apply_rotary_pos_emb


class NormLike(Protocol):
    weight: torch.Tensor  # [hidden]
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class Ops(Protocol):
    """The loop's steps between products."""

    name: str  # for the log: "stock" or "fused/8"

    def add_norm(self, x: torch.Tensor, d: torch.Tensor | None, norm: NormLike) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + d, norm(x + d)) ([1, n, hidden] each; d None: x as is)."""
        ...

    def rotate_and_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: RequestKV, layer: int,
                         past: int, heads: int, head_dim: int, rotary: Rotary) -> torch.Tensor:
        """q rotated ([1, heads, n, head_dim] from qkv [1, n, rows]); k rotated and v written into ``kv``
        from ``past`` on."""
        ...


class StockOps:
    """The stock operations, as the model's own code makes them."""

    name = "stock"

    def add_norm(self, x: torch.Tensor, d: torch.Tensor | None, norm: NormLike) -> tuple[torch.Tensor, torch.Tensor]:
        x = x if d is None else x + d  # [1, n, hidden]
        return x, norm(x)

    def rotate_and_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: RequestKV, layer: int,
                         past: int, heads: int, head_dim: int, rotary: Rotary) -> torch.Tensor:
        n, q_end = qkv.shape[-2], heads * head_dim
        k_end = q_end + (qkv.shape[-1] - q_end) // 2
        q = qkv[..., :q_end].view(1, n, -1, head_dim).transpose(1, 2)  # [1, heads, n, head_dim]
        k = qkv[..., q_end:k_end].view(1, n, -1, head_dim).transpose(1, 2)  # [1, kv_heads, n, head_dim]
        v = qkv[..., k_end:].view(1, n, -1, head_dim).transpose(1, 2)  # [1, kv_heads, n, head_dim]
        q, k = rotary(q, k, cos, sin)
        kv.write(layer, past, k, v)
        return q


class FusedOps:
    """The same steps in ``lean_ops.cpp``, the norm's sum over vectors of ``lanes`` floats."""

    def __init__(self, ext: ModuleType, lanes: int) -> None:
        self.ext = ext
        self.lanes = lanes
        self.name = f"fused/{lanes}"

    def add_norm(self, x: torch.Tensor, d: torch.Tensor | None, norm: NormLike) -> tuple[torch.Tensor, torch.Tensor]:
        check("lean", x, d, norm.weight)
        total, normed = self.ext.add_rms_norm(x, d, norm.weight.detach(), norm.eps, self.lanes)
        return total, normed

    def rotate_and_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: RequestKV, layer: int,
                         past: int, heads: int, head_dim: int, rotary: Rotary) -> torch.Tensor:
        keys, values = kv.keys[layer], kv.values[layer]
        check("lean", qkv, cos, sin)
        check_cache("lean", keys, values)
        return self.ext.rotary_into_cache(qkv, cos, sin, keys, values, past, heads, head_dim)


def extension() -> ModuleType | None:
    """The compiled steps (``cext.build``: once per process); None where they cannot be built."""
    return build(EXTENSION, SOURCE, FLAGS)


def candidates() -> list[Ops]:
    """The steps to try, fastest first: fused over each vector width, then stock (always there)."""
    ext = extension()
    fused: list[Ops] = [] if ext is None else [FusedOps(ext, lanes) for lanes in LANES]
    return [*fused, StockOps()]
