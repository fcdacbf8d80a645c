"""CPU fast path for small forwards: Linear layers whose output rows are cut into one block per thread.

A one-token forward is a chain of one-row products (GEMV) that read every weight once, so its speed
is the memory bandwidth the product reaches. MKL's fp32 GEMV runs one of the intra-op threads: on a
2-core AMD EPYC it read 10-12 GB/s with 1 thread and with 2, where the two cores stream 24 GB/s. Cut
W's output rows into ``parts`` equal blocks (a free view: W is row-major) and run one batched product
(``torch.bmm``) over the blocks: MKL then spreads the blocks over the threads, 19-25 GB/s on the same
box (e.g. the 49152 x 576 lm_head 9.4 ms -> 5.5 ms; 1536 x 576: 325 us -> 185 us; also faster at 2..64
rows). At one row the result equals the stock kernel's bit for bit (the same GEMV per block: checked
on every shape measured, and by ``tests/core/test_core_split.py``), so the one-token path is the plain
decoding baseline's own arithmetic. From 2 rows, like the stock GEMM and the packed kernel, it differs
from the one-row product by float summation order (~1e-5 relative), as every tree verification does.
A bias (qwen2's q/k/v) goes into the same batched call (``torch.baddbmm``: the product added to it, as
the stock ``addmm`` does), so a biased layer is the stock result bit for bit at one row too.
``split_linears(twin)`` swaps a twin's ``nn.Linear`` modules whose rows divide evenly;
``kernels.KernelSet`` measures where it wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from .linear_swap import SharedLinear
from .placement import check_product, model_ok

log = logging.getLogger(__name__)

MIN_PARTS = 2  # fewer blocks than this is the stock kernel

Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]  # (x, W, b) -> x W^T + b
OneRow = Product  # a product of a single row


def split_parts(threads: int | None = None) -> int:
    """Blocks to cut a weight into: one per intra-op thread the forwards will run with (the threads the
    batched product spreads over); ``threads`` None: this thread's count."""
    return torch.get_num_threads() if threads is None else threads


def splittable(model: nn.Module, threads: int | None = None) -> bool:
    """Whether ``split_linears`` can help: an fp32 CPU model (MKL's products, where the bit-for-bit
    equality was measured) run with at least ``MIN_PARTS`` intra-op threads (``threads``: the forwards'
    count, which may differ from this thread's: ``split_parts``)."""
    return model_ok(model) and split_parts(threads) >= MIN_PARTS


def single_row(x: torch.Tensor) -> bool:
    """Whether ``x`` ([..., in]) is a single row: what a ``OneRow`` product takes."""
    return x.numel() == x.shape[-1]


def routed(x: torch.Tensor, one_row: OneRow | None, many_rows: Product | None) -> Product | None:
    """The product that takes ``x`` ([..., in]): ``one_row`` for a single row, else ``many_rows``; None: the
    layer's own (split or weight-major)."""
    return one_row if one_row is not None and single_row(x) else many_rows


def split_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> torch.Tensor:
    """x W^T + b with W's rows in ``parts`` blocks, as one batched product: [..., in] -> [..., out]."""
    check_product("split", x, weight, bias)
    out_features, in_features = weight.shape
    rows = x.reshape(1, -1, in_features).expand(parts, -1, -1)  # [parts, M, in]: the same rows per block
    blocks = weight.view(parts, -1, in_features).transpose(1, 2)  # [parts, in, out/parts]
    y = (torch.bmm(rows, blocks) if bias is None  # [parts, M, out/parts]
         else torch.baddbmm(bias.view(parts, 1, -1), rows, blocks))
    return y.transpose(0, 1).reshape(*x.shape[:-1], out_features)  # [..., out]


class SplitLinear(SharedLinear):
    """y = x W^T + b with W's rows in ``parts`` blocks, multiplied as one batched product (inference only)."""

    def __init__(self, linear: nn.Linear, parts: int, one_row: OneRow | None = None,
                 many_rows: Product | None = None) -> None:
        if linear.out_features % parts:
            raise ValueError("SplitLinear needs a Linear whose out_features divide by parts")
        super().__init__(linear)
        self.parts = parts
        self.one_row = one_row  # the product of a single row (``gemv.gemv_product``); None: the split one
        self.many_rows = many_rows  # the product of several rows (``rows.rows_product``); None: the split one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product = routed(x, self.one_row, self.many_rows)
        if product is not None:
            return product(x, self.weight, self.bias)  # [..., out]
        return split_product(x, self.weight, self.bias, self.parts)  # [..., out]


def split_linears(module: nn.Module, parts: int | None = None, one_row: OneRow | None = None,
                  many_rows: Product | None = None) -> int:
    """Replace every ``nn.Linear`` under ``module`` whose rows divide into ``parts`` (default:
    ``split_parts()``) by a ``SplitLinear`` (``one_row``: its single-row product; ``many_rows``: its product of
    several), in place; returns how many were replaced."""
    parts = split_parts() if parts is None else parts
    if parts < MIN_PARTS:
        return 0
    linears = [(name, mod) for name, mod in module.named_modules()
               if type(mod) is nn.Linear and mod.out_features % parts == 0]
    for name, mod in linears:
        module.set_submodule(name, SplitLinear(mod, parts, one_row, many_rows))
    log.info("split %d linear layers into %d row blocks", len(linears), parts)
    return len(linears)
