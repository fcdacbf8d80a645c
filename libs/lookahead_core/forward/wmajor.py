"""Tree forwards on the model's own weights: x W^T computed weight-major, as (W x^T)^T.

A verification forward multiplies every weight by a handful of rows. PyTorch's fp32 CPU GEMM
(``F.linear``: the rows as the left operand) costs nearly one weight pass per row there: on a
2-core AMD EPYC, Qwen2.5's 151,936 x 896 lm_head took 114 / 192 / 218 ms at 2 / 4 / 8 rows against
54 ms at one. The same product with the weight as the left operand (``torch.mm(W, x^T)``, its
[out, rows] result transposed back) streams the weight once for every row: 45 / 64 / 82 ms; the
joined gate/up (9728 x 896) 7.1 / 8.4 / 8.4 -> 2.9 / 2.9 / 4.9 ms. Nothing is copied or packed:
the weight is the model's own row-major tensor. Like every tree kernel the result differs from the
one-row product by float summation order (~1e-5 relative), so one-token forwards keep an exact
kernel (``kernels.one_token``) and ``kernels.KernelSet`` measures where this one wins (the GEMM
that is slow here may be fast elsewhere).

``weight_major_linears(twin)`` swaps a twin's ``nn.Linear`` modules for ``WeightMajorLinear``;
``fused.fuse_linears(twin, weight_major=True)`` runs the joined q/k/v and gate/up this way too.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear_swap import SharedLinear, swap_linears
from .placement import check_product, model_ok


def weight_major_ok(model: nn.Module) -> bool:
    """Whether the weight-major twin is offered: an fp32 CPU model (where the slow small-row GEMM was measured;
    half precision and GPUs run the stock kernels only)."""
    return model_ok(model)


def weight_major_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b as (b + W x^T)^T: [..., in] -> [..., out], contiguous."""
    check_product("weight-major", x, weight, bias)
    out_features, in_features = weight.shape
    rows_t = x.reshape(-1, in_features).t()  # [in, M]: a view
    y = (torch.mm(weight, rows_t) if bias is None  # [out, M]
         else torch.addmm(bias.unsqueeze(1), weight, rows_t))
    return y.t().contiguous().view(*x.shape[:-1], out_features)  # [..., out]


class WeightMajorLinear(SharedLinear):
    """y = x W^T + b with the weight as the product's left operand (inference only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weight_major_product(x, self.weight, self.bias)  # [..., out]


def weight_major_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a ``WeightMajorLinear``, in place; returns how many."""
    return swap_linears(module, WeightMajorLinear, "weight-major")
