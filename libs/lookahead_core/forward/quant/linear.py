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

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from torch import nn

from .blocks import Packed
from .kernel import FMT, kernel


class NoBlockKernel(RuntimeError):
    """No build of the block kernel runs on this CPU (said in one line)."""


def block_kernel() -> ModuleType:
    """The block kernel this process runs (``kernel.kernel``), or NoBlockKernel."""
    ext = kernel()
    if ext is None:
        raise NoBlockKernel("no build of the block kernel runs on this CPU (AVX2 or AVX-512 and a compiler needed): "
                            "serve [model] weights = \"float32\"")
    return ext


@dataclass(frozen=True)
class QuantWeight:
    """One weight [out, in] as affine groups, in tensors the kernel reads."""

    fmt: str  # blocks.U4, I8 or F32
    group: int  # elements a scale covers
    codes: torch.Tensor  # uint8 [out, in / 2] (u4), int8 [out, in] (i8), float32 [out, in] (f32)
    scales: torch.Tensor  # float32 [out, in / group]
    offsets: torch.Tensor | None  # float32 [out, in / group], or None: every offset is 0
    source: str  # the file's block type, e.g. "Q4_1"

    @classmethod
    def of(cls, packed: Packed) -> QuantWeight:
        """The tensors of ``packed`` (numpy arrays become tensors without a copy)."""
        def tensor(a: np.ndarray) -> torch.Tensor:  # a read-only array (a file's mmap) is copied, else shared
            return torch.from_numpy(np.require(a, requirements=["C", "W"]))

        offsets = None if packed.offsets is None else tensor(packed.offsets)
        return cls(packed.fmt, packed.group, tensor(packed.codes), tensor(packed.scales), offsets, packed.source)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.scales.shape[0]), int(self.scales.shape[1] * self.group)

    def rows(self, sel: torch.Tensor) -> QuantWeight:
        """The weight's rows ``sel`` [n] (a permutation or a subset) as a new weight."""
        return QuantWeight(self.fmt, self.group, self.codes[sel].contiguous(), self.scales[sel].contiguous(),
                           None if self.offsets is None else self.offsets[sel].contiguous(), self.source)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + b: [..., in] fp32 -> [..., out] (width-invariant)."""
        return block_kernel().qlinear(x, self.codes, self.scales, self.offsets, bias, self.group, FMT[self.fmt])

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) de-quantized: [*ids.shape, in]."""
        out = block_kernel().dequant_rows(ids, self.codes, self.scales, self.offsets, self.shape[1], self.group,
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
