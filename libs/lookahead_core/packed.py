"""CPU fast path for tree verification: Linear layers with oneDNN pre-packed weights.

A verification forward multiplies every weight by a handful of rows (the draft tree). For 2..64
rows, PyTorch's default CPU GEMM repacks the weight on every call and costs 2-5x a one-row
product; oneDNN with the weight packed once does the same product in about the one-row time.
``packed_copy(model)`` returns a twin of the model whose ``nn.Linear`` modules use packed weights
(and whose sdpa attention is ``attention.tree_sdpa``) and which shares every other parameter
(and the original weights) with ``model``: the model's
own code is untouched and ``model`` itself keeps the stock kernels (the greedy baseline).
Results differ from the stock kernels only by float summation order (~1e-6 relative).
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from .attention import TREE_SDPA

log = logging.getLogger(__name__)

PACK_BATCH_HINT = 16  # rows oneDNN tunes the packed layout for (the typical tree size)


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN packed-linear ops (CPU builds with mkldnn)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """y = x W^T + b with W pre-packed for oneDNN (inference only, CPU, fp32)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = PACK_BATCH_HINT) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # shared with the source model (same tensor, no copy)
        self.bias = linear.bias
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, bias, "none", [], "")


def packed_copy(model: nn.Module, batch_hint: int = PACK_BATCH_HINT) -> nn.Module:
    """A twin of ``model`` for CPU verification forwards (see module doc); ``model`` if not applicable.

    Only fp32 CPU models with oneDNN are converted; anything else is returned unchanged.
    """
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32 or not onednn_available():
        return model
    # Share parameters and buffers: deepcopy duplicates only the module objects.
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo)
    linears = [(name, mod) for name, mod in twin.named_modules() if type(mod) is nn.Linear]
    for name, mod in linears:
        twin.set_submodule(name, PackedLinear(mod, batch_hint))
    if getattr(twin.config, "_attn_implementation", None) == "sdpa":
        twin.set_attn_implementation(TREE_SDPA)  # grouped K/V heads stay unexpanded under the tree mask
    log.info("packed %d linear layers for oneDNN", len(linears))
    return twin.eval()
