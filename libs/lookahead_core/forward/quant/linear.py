"""Linear and embedding layers over a GGUF file's blocks, served as they are (``qlinear.cpp``).

``QuantWeight`` holds one weight's affine groups as tensors (``blocks.Packed``); ``QuantLinear`` replaces
an ``nn.Linear`` (its bias kept in fp32) and ``QuantEmbedding`` an ``nn.Embedding``, whose lookup
de-quantizes only the rows asked for, by the kernel's own fma (so a tied lm_head and its embedding read
one copy of the blocks). Every product is width-invariant: a row's output does not depend on the rows
that share its forward (``qlinear.cpp``), so a tree row's logits are its one-token forward's bit for bit.

    layer = QuantLinear(QuantWeight.of(packed), bias=None)
    layer(x)  # x [..., in] fp32 -> [..., out]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np
import torch
from torch import nn

from .blocks import Packed
from .kernel import FMT, kernel
from .qdot import int8_kernel
from .tiled import LANES, tileable, tiled_arrays


class NoBlockKernel(RuntimeError):
    """No build of the block kernel runs on this CPU (said in one line)."""


def _offered(ext: ModuleType | None, refusal: str) -> ModuleType:
    if ext is None:
        raise NoBlockKernel(refusal)
    return ext


def block_kernel() -> ModuleType:
    """The block kernel this process runs (``kernel.kernel``), or NoBlockKernel."""
    return _offered(kernel(), "no build of the block kernel runs on this CPU (AVX2 or AVX-512 and a compiler "
                    "needed): serve [model] weights = \"float32\"")


def tiled_kernel() -> ModuleType:
    """The int8-activation kernel (``qdot.int8_kernel``); a tiled weight exists only where it runs."""
    return _offered(int8_kernel(), "no build of the int8-activation kernel runs on this CPU: serve [model] "
                    "activations = \"float32\"")


@dataclass(frozen=True)
class QuantWeight:
    """One weight [out, in] as affine groups, in tensors the kernel reads."""

    fmt: str  # blocks.U4, I8 or F32
    group: int  # elements a scale covers
    codes: torch.Tensor  # uint8 [out, in / 2] (u4), int8 [out, in] (i8), float32 [out, in]; tiled: uint8 [out / 16, -1]
    scales: torch.Tensor  # float32 [out, in / group]; tiled: [out / 16, in / group, 16]
    offsets: torch.Tensor | None  # float32 [out, in / group], or None: every offset is 0
    source: str  # the file's block type, e.g. "Q4_1"
    tiled: bool = False  # codes, scales, offsets in the int8 kernel's layout (tiled.py), served by qdot.cpp

    @classmethod
    def of(cls, packed: Packed) -> QuantWeight:
        """The tensors of ``packed`` (numpy arrays become tensors without a copy)."""
        def tensor(a: np.ndarray) -> torch.Tensor:  # a read-only array (a file's mmap) is copied, else shared
            return torch.from_numpy(np.require(a, requirements=["C", "W"]))

        offsets = None if packed.offsets is None else tensor(packed.offsets)
        return cls(packed.fmt, packed.group, tensor(packed.codes), tensor(packed.scales), offsets, packed.source)

    @property
    def shape(self) -> tuple[int, int]:
        if self.tiled:  # scales [out / 16, in / group, 16]
            return int(self.scales.shape[0] * LANES), int(self.scales.shape[1] * self.group)
        return int(self.scales.shape[0]), int(self.scales.shape[1] * self.group)

    @property
    def row_unit(self) -> int:
        """Rows of the weight one step along dim 0 of its tensors holds (a tile's 16 when tiled)."""
        return LANES if self.tiled else 1

    def slice_rows(self, lo: int, hi: int) -> QuantWeight:
        """Rows [lo, hi) as views of this weight's storage (multiples of ``row_unit``)."""
        unit = self.row_unit
        if lo % unit or hi % unit:
            raise ValueError(f"rows [{lo}, {hi}) of a weight tiled by {unit}")
        a, b = lo // unit, hi // unit
        return replace(self, codes=self.codes[a:b], scales=self.scales[a:b],
                       offsets=None if self.offsets is None else self.offsets[a:b])

    def for_int8(self) -> QuantWeight:
        """This weight in the int8 kernel's tiled layout, where it takes it (``tiled.tileable``); else itself."""
        rows, cols = self.shape
        if self.tiled or not tileable(self.fmt, self.group, rows, cols):
            return self
        codes, scales, offsets = tiled_arrays(self.fmt, self.codes.numpy(), self.scales.numpy(),
                                              None if self.offsets is None else self.offsets.numpy())
        tiles = torch.from_numpy(codes).view(rows // LANES, -1)  # [out / 16, a tile's bytes]: dim 0 is a tile
        return replace(self, codes=tiles, scales=torch.from_numpy(scales),
                       offsets=None if offsets is None else torch.from_numpy(offsets), tiled=True)

    def rows(self, sel: torch.Tensor) -> QuantWeight:
        """The weight's rows ``sel`` [n] (a permutation or a subset) as a new weight (row-major only)."""
        if self.tiled:
            raise ValueError("rows of a tiled weight: select rows before tiling")
        return QuantWeight(self.fmt, self.group, self.codes[sel].contiguous(), self.scales[sel].contiguous(),
                           None if self.offsets is None else self.offsets[sel].contiguous(), self.source)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + b: [..., in] fp32 -> [..., out] (width-invariant)."""
        if self.tiled:
            return tiled_kernel().qdot(x, self.codes, self.scales, self.offsets, bias, self.group, FMT[self.fmt])
        return block_kernel().qlinear(x, self.codes, self.scales, self.offsets, bias, self.group, FMT[self.fmt])

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) de-quantized: [*ids.shape, in]."""
        ext = tiled_kernel() if self.tiled else block_kernel()
        out = ext.dequant_rows(ids, self.codes, self.scales, self.offsets, self.shape[1], self.group,
                                          FMT[self.fmt])
        return out.view(*ids.shape, self.shape[1])


class QuantLinear(nn.Module):
    """y = x W^T + b over a ``QuantWeight`` (inference only, fp32 activations on the CPU)."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)
        self.use(weight)

    def use(self, weight: QuantWeight) -> None:
        """Read ``weight`` (the same shape; e.g. views of a joined storage) from now on."""
        self.qweight = weight
        for name in ("codes", "scales", "offsets"):  # buffers: module copies (twins) share them, .to() sees them
            self.register_buffer(f"q_{name}", getattr(weight, name), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qweight.product(x, self.bias)  # [..., out]

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, blocks={self.qweight.source}"


class QuantEmbedding(nn.Module):
    """An embedding table over a ``QuantWeight``: a lookup de-quantizes the rows asked for."""

    def __init__(self, weight: QuantWeight, padding_idx: int | None = None) -> None:
        super().__init__()
        self.qweight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.padding_idx = padding_idx
        for name in ("codes", "scales", "offsets"):
            self.register_buffer(f"q_{name}", getattr(weight, name), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight.lookup(ids)  # [*ids.shape, dim]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, blocks={self.qweight.source}"
