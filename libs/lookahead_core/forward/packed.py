"""CPU fast path for tree verification: Linear layers with oneDNN pre-packed weights.

A verification forward multiplies every weight by a handful of rows (the draft tree). For 2..64
rows, PyTorch's default CPU GEMM repacks the weight on every call and costs 2-5x a one-row
product; oneDNN with the weight packed once does the same product in about the one-row time
(on some machines only from ~8 rows: ``kernels.KernelSet`` measures which to run per forward).
``pack_linears(twin)`` swaps a twin's ``nn.Linear`` modules for ``PackedLinear`` (see
``kernels.make_twin``, which builds the twin so the original model keeps the stock kernels).
Results differ from the stock kernels only by float summation order (~1e-6 relative).

The packed weight is a second copy of every Linear weight (2.0 GB on Qwen2.5-0.5B fp32). oneDNN also
takes the model's own row-major weight (``OneDNNLinear``, ``onednn_linears``: no copy); it then lays
out the weight per call, but at 8 rows it still beat the stock GEMM by ~3x on one 2-core EPYC
(9728 x 896: 98 -> 28 ms under heavy load; the packed copy 16 ms), so it is the tree kernel that
shares the weights, and the start-up measurement chooses between them.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .linear_swap import SharedLinear, swap_linears
from .placement import check, check_product, model_ok

log = logging.getLogger(__name__)

PACK_BATCH_HINT = 16  # rows oneDNN tunes the packed layout for (the typical tree size)


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN packed-linear ops (CPU builds with mkldnn)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(SharedLinear):
    """y = x W^T + b with W pre-packed for oneDNN (inference only, CPU, fp32)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = PACK_BATCH_HINT) -> None:
        check("packed", linear.weight, linear.bias)
        super().__init__(linear)
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check("packed", x)  # its weights were checked when packed
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, bias, "none", [], "")


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b by oneDNN on the weight as it is (no copy): [..., in] -> [..., out]."""
    check_product("onednn", x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(
        x, weight.detach(), None if bias is None else bias.detach(), "none", [], "")  # [..., out]


class OneDNNLinear(SharedLinear):
    """y = x W^T + b by oneDNN on the model's own weight (inference only, CPU, fp32; no copy)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_product(x, self.weight, self.bias)  # [..., out]


def onednn_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` (in place) by a ``OneDNNLinear``; returns how many."""
    return swap_linears(module, OneDNNLinear)


def packable(model: nn.Module) -> bool:
    """Whether ``pack_linears`` applies: an fp32 CPU model and a torch build with oneDNN."""
    return model_ok(model) and onednn_available()


def pack_linears(module: nn.Module, batch_hint: int = PACK_BATCH_HINT) -> int:
    """Replace every ``nn.Linear`` under ``module`` (in place) by a ``PackedLinear``; returns how many."""
    count = swap_linears(module, lambda linear: PackedLinear(linear, batch_hint))
    log.info("packed %d linear layers for oneDNN", count)
    return count
