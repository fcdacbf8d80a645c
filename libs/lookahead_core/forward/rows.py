"""Tree forwards near the memory-bandwidth floor: every weight row read once for all of a tree's rows.

A verification forward multiplies every weight by a handful of rows (the tree). MKL's fp32 GEMM at 2-16
rows is far from memory-bound on AMD CPUs, and so is the weight-major product (``wmajor``).
``rows_gemm.cpp`` is a small AVX2 kernel that streams each weight row from memory once and multiplies
it, while it sits in L1, by up to 8 rows held in registers (blocks of 8 beyond), the weight's rows
split over torch's own OpenMP pool (a plain ``omp parallel for`` with the calling thread's count: the
extension links the libgomp torch already loaded, so no second pool competes for the cores). Measured
on a 2-core AMD EPYC, 2 threads, one product (ms, stock ``F.linear`` -> rows): Qwen2.5's 151,936 x 896
lm_head at 1 / 2 / 4 / 8 / 16 rows 49 / 117 / 165 / 158 / 195 -> 28 / 29 / 37 / 43 / 84; its joined
gate/up (9728 x 896) 3.6 / 7.8 / 10.4 / 9.8 / 11.0 -> 1.8 / 2.0 / 2.3 / 2.9 / 5.2.

Past 4 rows that kernel is compute-bound: every 8 columns it loads one weight vector and 8 x vectors for
8 FMAs. On CPUs with AVX-512 (torch's capability ``AVX512``) ``rows512.cpp`` is built too, and takes its
place where it multiplies a probe tree faster (timed once per process, ``faster``): a register
tile of 4 weight rows by 6 x rows (24 accumulators of 16 floats) loads 10 vectors for 24 FMAs, and the
next tile's weights are prefetched while this one is multiplied, spread over all its passes over the x rows
(past 6 rows a tile takes two or more; prefetching only during the first left memory idle in the others).
Every product of SmolLM2-135M (30 layers and the lm_head) on a 2-core AMD EPYC (Zen 5), 2 threads, in ms,
AVX2 -> AVX-512 (stock ``F.linear``): 4 rows 11.7 -> 11.7 (48.0), 8 rows 23.3 -> 13.4 (52.4), 10 rows
33.7 -> 13.8 (60.0), 16 rows 47.1 -> 17.8 (61.7), 32 rows 102.5 -> 29.5 (83.3); prefetching during the first
pass only, in the same hour: 8 rows 14.7, 10 rows 16.4, 16 rows 25.1, 32 rows 36.1.

Both are compiled at first use (``cext.build``), the AVX2 one for CPUs with AVX2 and FMA; where neither
can be built the kernel is not offered. Like
every tree kernel its sums run in another order than the stock one-row product (~1e-6 relative), so
one-token forwards keep an exact kernel (``kernels.one_token``) and ``kernels.KernelSet`` measures where
this one wins. ``rows_linears(twin)`` swaps a twin's ``nn.Linear`` modules for ``RowsLinear``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import nn

from .cext import CAPABLE_512, FLAGS_512, build
from .linear_swap import SharedLinear, swap_linears
from .placement import check_product, model_ok

GLUE = "rows_linear.inc"  # both kernels' torch glue (checks, output, binding), appended to each
SOURCE = ("rows_gemm.cpp", GLUE)  # the kernel (C++, AVX2 intrinsics, OpenMP), beside this module
EXTENSION = "lookahead_rows_gemm"  # its module name in torch's extension cache
SOURCE_512 = ("rows512.cpp", GLUE)  # the AVX-512 kernel (a register tile of weight rows by x rows), beside this module
EXTENSION_512 = "lookahead_rows512"  # its module name in torch's extension cache
PROBE_ROWS = 16  # rows of the probe product the builds are timed on (a typical verification tree)
PROBE_WEIGHT = (4096, 1024)  # its weight [out, in]: 16 MB, past the cores' L2, as a model's products are
PROBE_REPEATS = 3  # timed calls per build; the fastest is kept


def avx2_extension() -> ModuleType | None:
    """The AVX2 kernel (``cext.build``: once per process); None where it is not built."""
    return build(EXTENSION, SOURCE)


def avx512_extension() -> ModuleType | None:
    """The AVX-512 kernel; None on CPUs without AVX-512 (torch's capability) or where it is not built."""
    return build(EXTENSION_512, SOURCE_512, FLAGS_512, CAPABLE_512)


@functools.cache
def extension() -> ModuleType | None:
    """The kernel the rows product runs: the faster of the builds this CPU has (timed once per process, in
    the first caller's threads); None where neither is offered."""
    builds = [b for b in (avx512_extension(), avx2_extension()) if b is not None]
    return faster(builds) if builds else None


def faster(builds: Sequence[ModuleType], repeats: int = PROBE_REPEATS) -> ModuleType:
    """The build whose ``rows_linear`` multiplies a ``PROBE_ROWS``-row tree by a ``PROBE_WEIGHT`` weight
    fastest (the best of ``repeats`` timed calls each, after one untimed); the only one without timing."""
    if len(builds) == 1:
        return builds[0]
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(*PROBE_WEIGHT, generator=gen)  # [out, in]
    x = torch.randn(PROBE_ROWS, PROBE_WEIGHT[1], generator=gen)  # [rows, in]

    def seconds(build: ModuleType) -> float:
        build.rows_linear(x, weight)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            build.rows_linear(x, weight)
            best = min(best, time.perf_counter() - started)
        return best

    return min(builds, key=seconds)


def rows_ok(model: nn.Module) -> bool:
    """Whether the rows twin is offered: an fp32 CPU model and a kernel built for this CPU."""
    return model_ok(model) and extension() is not None


def rows_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b by the rows kernel: [..., in] -> [..., out]."""
    check_product("rows", x, weight, bias)
    ext = extension()
    if ext is None:
        raise RuntimeError("the rows kernel is not built on this machine (rows_ok() is False)")
    return ext.rows_linear(x, weight.detach(), None if bias is None else bias.detach())  # [..., out]


class RowsLinear(SharedLinear):
    """y = x W^T + b, every weight row read once for all rows (inference only, fp32 CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rows_product(x, self.weight, self.bias)  # [..., out]


def rows_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a ``RowsLinear``, in place; returns how many."""
    return swap_linears(module, RowsLinear, "the rows kernel")
