"""The int8-activation block kernel (``qdot.cpp``): whether it runs here, its self-test, its weights' layout.

``[model] activations = "int8"`` (the default) serves a quantized model's products as llama.cpp does: each x
row quantized to int8 per block of 32, the weights' integer codes multiplied as integers (AVX-512 VNNI),
fp32 scales applied per span. It is offered only where its build passes a self-test in a child process
(``kernel.runs_here``: a CPU may advertise what it cannot run); elsewhere, and for a weight it does not take
(``tiled.tileable``), the fp32 block kernel (``qlinear.cpp``) serves, with one log line.

Each x row is quantized alone and each output is one lane's fixed chain of operations, so the kernel is as
width-invariant as the fp32 one: speculation stays token-identical to the same model's one-token decoding.
The arithmetic is not the fp32 kernel's (x is rounded to 8 bits): bounds in the tests.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

from .blocks import I8, U4, pack_u4
from .kernel import FMT, INT8_BUILDS, PROBE_REPEATS, extension, runs_here
from .tiled import LANES, X_BLOCK, tile_codes, tile_groups

log = logging.getLogger(__name__)

INT8 = "int8"  # x rounded to int8 per block of 32, integer products (qdot.cpp)
FLOAT32 = "float32"  # each block de-quantized, fp32 products (qlinear.cpp)
ACTIVATIONS = (INT8, FLOAT32)  # what [model] activations accepts
SELFTEST_SHAPE = (21, 48, 128)  # the child's product: rows (a whole AMX tile and a tail), out (16s), in
Q_STEPS = 127  # int8 steps from 0 to a block's largest |x|
AMX_PROBE = (32, 1536, 576)  # the AMX-or-VNNI timing product: rows (two AMX tiles), out, in (a small MLP's)
AMX_FROM = 16  # rows from which a product runs its whole 16-row blocks on AMX where it times faster here


def x_error_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most int8 rounding of ``x`` [M, K] can move x w^T, per output [M, N]: half a step of each x block
    times the block's sum of |w| (float64), plus fp32 accumulation slack."""
    rows, cols = x.shape
    step = np.abs(x.reshape(rows, cols // X_BLOCK, X_BLOCK)).max(axis=2) / Q_STEPS  # [M, K/32]
    wsum = np.abs(w).reshape(w.shape[0], cols // X_BLOCK, X_BLOCK).sum(axis=2)  # [N, K/32]
    exact = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return 0.5 * step @ wsum.T + 1e-5 * (exact + 1.0)


def selftest(ext: ModuleType) -> int:
    """Run the int8 build on small random u4 and i8 products and compare with float64 within the bound of x's
    rounding (``x_error_bound``); 0 when every output is within it (the child's exit code)."""
    rows, out, cols = SELFTEST_SHAPE
    gen = np.random.default_rng(0)
    x = gen.standard_normal((rows, cols)).astype(np.float32)
    scales = gen.random((out, cols // 32)).astype(np.float32)
    offsets = gen.standard_normal((out, cols // 32)).astype(np.float32)
    for fmt, codes in ((U4, gen.integers(0, 16, (out, cols)).astype(np.uint8)),
                       (I8, gen.integers(-127, 128, (out, cols)).astype(np.int8))):
        w = np.repeat(scales, 32, 1).astype(np.float64) * codes + np.repeat(offsets, 32, 1)
        stored = pack_u4(codes) if fmt == U4 else codes
        args = (torch.from_numpy(tile_codes(fmt, stored, out, cols)), torch.from_numpy(tile_groups(scales)),
                torch.from_numpy(tile_groups(offsets)), None, 32, 0 if fmt == U4 else 1)
        got = ext.qdot(torch.from_numpy(x), *args).numpy()
        if not np.all(np.abs(got - x.astype(np.float64) @ w.T) <= x_error_bound(x, w)):
            return 1
        alone = [ext.qdot(torch.from_numpy(x[r : r + 1]), *args).numpy() for r in range(rows)]
        if not np.array_equal(np.concatenate(alone), got):  # a row alone (the VNNI path) = in the batch (AMX)
            return 1
    return 0


@functools.cache
def int8_kernel() -> ModuleType | None:
    """The int8-activation build that serves here: the AMX one where its self-test passes on this CPU (a CPU
    may advertise AMX and fault on it), else the VNNI one; None where neither runs (logged once)."""
    ext = next((extension(name) for name in INT8_BUILDS if runs_here(name)), None)
    if ext is not None:
        amx = keep_amx(ext)  # AMX or VNNI for whole 16-row blocks, by timing here
        log.info("int8 activations: %s%s", ext.__name__, "" if amx else " (its VNNI path: AMX timed slower or absent)")
    else:
        log.info("int8 activations are not offered on this CPU (no AVX-512 VNNI build runs here): "
                 "quantized products de-quantize each block to fp32")
    return ext


def keep_amx(ext: ModuleType | Any, repeats: int = PROBE_REPEATS,
             clock: Callable[[], float] = time.perf_counter) -> bool:
    """Time ``AMX_PROBE`` with whole 16-row blocks on AMX and with VNNI only (the same bits either way) and keep
    the faster for every product of this process (``ext.amx_rows``); True where AMX is kept. A build without
    AMX keeps VNNI untimed."""
    if ext.amx_rows(0) == 0:  # no AMX in this build
        return False
    rows, out, cols = AMX_PROBE
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=gen)  # [rows, in]
    codes = torch.randint(0, 256, (out // LANES, LANES * cols // 2), dtype=torch.uint8,
                          generator=gen)  # tiled 4-bit codes: [out / 16, a tile's bytes]
    scales = torch.rand(out // LANES, cols // X_BLOCK, LANES, generator=gen)  # [out / 16, groups, 16]

    def seconds(amx_rows: int) -> float:
        ext.amx_rows(amx_rows)
        ext.qdot(x, codes, scales, scales, None, X_BLOCK, FMT["u4"])
        best = math.inf
        for _ in range(repeats):
            started = clock()
            ext.qdot(x, codes, scales, scales, None, X_BLOCK, FMT["u4"])
            best = min(best, clock() - started)
        return best

    amx, vnni = seconds(AMX_FROM), seconds(0)
    ext.amx_rows(AMX_FROM if amx <= vnni else 0)
    return amx <= vnni
