"""The exact one-token product, at the memory-bandwidth floor: plain greedy's GEMV summed in MKL's own order.

Every step of plain decoding (and every one-token step of ours) is a chain of one-row products, so its
speed is the bandwidth its GEMV reaches. The stock fp32 product for one row is MKL's GEMV, which on a 2-core
AMD EPYC reads 10-14 GB/s (split over the threads, ``split.py``: still ~11 GB/s on the 49,152 x 576
lm_head) where two cores stream ~17-26 GB/s. Any other kernel sums in another order (~1e-6 relative) and
could flip a near-tie: the rows kernel at one row is as fast but not plain greedy's arithmetic.

Probing MKL's GEMV with cancelling large values shows its order on these CPUs (``gemv.cpp`` spells it out):
- a dot product's first products, up to the weight row's next 16-byte boundary (four where it is on one),
  are added in turn;
- then four lanes, lane 0 starting from that sum, each add their products (rounded, then added: no FMA);
- then (lane 0 + lane 2) + (lane 1 + lane 3); then the products past the last whole four, in turn; a bias
  is added last;
- rows go four at a time: the last N mod 4 rows are summed otherwise (four products in turn whatever the
  alignment, then eight lanes folded lane i + lane i+4 first, or, for the second of them, the four lanes
  taking eight products a round).

So the stock product's bits depend on where a weight sits in memory: a checkpoint's mmapped tensor 8 bytes
off a 16-byte boundary sums otherwise than its aligned copy. ``gemv.cpp`` sums exactly so, eight weight
rows at a time in AVX2 registers (two per register) over torch's OpenMP pool: the same bits, at ~0.8x the
measured read bandwidth (the 49,152 x 576 lm_head 9.1 ms split -> 7.0 ms; Qwen2.5's 151,936 x 896 one
30.0 -> 28.2 ms on a slow host).

Another CPU's MKL may take another path and sum otherwise, so nothing is assumed: ``gemv_ok(model)``
multiplies every Linear weight of the model by a random row both ways, once per model, and offers the
kernel only where every output is the stock one bit for bit (``EXACT`` in ``kernels.py`` then holds by
measurement). ``kernels.KernelSet`` holds it as the ``gemv`` twin: fused, with every one-row product here.
"""

from __future__ import annotations

import logging
import weakref
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from .cext import build
from .placement import check_product, model_ok

log = logging.getLogger(__name__)

SOURCE = "gemv.cpp"  # the kernel (C++, AVX2 intrinsics, OpenMP), beside this module
EXTENSION = "lookahead_exact_gemv"  # its module name in torch's extension cache
FLAGS = ("-O3", "-mavx2", "-fopenmp", "-ffp-contract=off")  # no FMA: a product is rounded before it is added
LANES = 4  # in_features must be a multiple of the lanes' width (MKL's tail is summed otherwise)
MIN_IN = 16  # nor shorter: MKL sums rows of under 16 in another order (measured at 8 and 12)
CHECK_SEED = 0  # the random rows every weight is checked with

_checked: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()  # model -> gemv_ok's answer


def extension() -> ModuleType | None:
    """The compiled kernel (``cext.build``: once per process); None where it is not offered."""
    return build(EXTENSION, SOURCE, FLAGS)


def gemv_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b for one row x ([..., in] with one row in all -> [..., out]), in MKL's GEMV order."""
    check_product("gemv", x, weight, bias)
    ext = extension()
    if ext is None:
        raise RuntimeError("the exact GEMV is not built on this machine (gemv_ok() is False)")
    return ext.gemv(x, weight.detach(), None if bias is None else bias.detach())  # [..., out]


def same_as_stock(linear: nn.Linear, gen: torch.Generator) -> bool:
    """Whether the kernel gives the stock product's bits for a random row through ``linear``."""
    if linear.in_features % LANES or linear.in_features < MIN_IN:
        return False
    x = torch.randn(1, linear.in_features, generator=gen)  # [1, in]
    with torch.inference_mode():
        return torch.equal(gemv_product(x, linear.weight, linear.bias), F.linear(x, linear.weight, linear.bias))


def gemv_ok(model: nn.Module) -> bool:
    """Whether the gemv twin is offered for ``model``: an fp32 CPU model, a kernel built for this CPU, and
    every Linear's product the stock one bit for bit on this machine (checked once per model)."""
    if not model_ok(model) or extension() is None:
        return False
    if model not in _checked:
        gen = torch.Generator().manual_seed(CHECK_SEED)
        linears = [m for m in model.modules() if type(m) is nn.Linear]
        _checked[model] = bool(linears) and all(same_as_stock(m, gen) for m in linears)
        if not _checked[model]:
            log.warning("the exact GEMV does not sum as this machine's stock product does: not offered")
    return _checked[model]
