"""Attention of a segment of several rows (a prefill chunk, a draft tree) at the cores' FMA rate.

A step's profile on a 2-core AMD EPYC (SmolLM2-135M, 1 client) put attention at 49 of 165 ms a prefill step
and 7 of 27 ms a tree step: sdpa's flash kernel, like MKL's GEMMs at these shapes (head_dim 64 inner or
out), runs at ~140 GFLOP/s there. ``attend.cpp`` computes a kv head's rows a vector at a time, one lane a
row (scores from the cache's keys as they lie, softmax along the keys, then the values), ~300 GFLOP/s with
AVX-512: a 183-row chunk over 400 cached entries (9 query heads, 3 kv heads) 1.6 -> 0.8 ms a layer.

Every row goes through the same operations whatever rows share its call, so a tree row's result does not
depend on its tree. Its sums run in another order than sdpa's (~1e-7 relative), as every tree kernel's do:
a forward of several rows (a prefill chunk, trees, several requests' one-token steps) runs all its segments
through the kernel in one call (``attend_segments``: their tasks share one parallel loop; 16 one-row
segments over 600 entries take 0.6x sdpa's time), and a one-token forward (plain greedy's arithmetic bit for
bit) keeps sdpa. Both builds the CPU has (AVX2; AVX-512 where torch reports it) are timed once per process
against sdpa on a probe forward (a prompt chunk and four requests' trees), and the fastest is kept
(``kernel``): where sdpa wins, or nothing builds, every segment keeps sdpa.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from types import ModuleType

import torch
import torch.nn.functional as F

from .cext import CAPABLE_512, FLAGS, FLAGS_512, build
from .placement import check, check_cache, check_on_cpu, cpu_kernels_ok

log = logging.getLogger(__name__)

SOURCE = "attend.cpp"  # the kernel (C++, GCC vector extensions, OpenMP), beside this module
EXTENSION = "lookahead_attend"  # the AVX2 build's module name in torch's extension cache
EXTENSION_512 = "lookahead_attend512"  # the AVX-512 build's
PROBE = ((64, 256), (8, 512), (8, 512), (8, 512), (8, 512))  # the probe forward: each segment's (rows, cached
# entries before them): a prompt chunk and four requests' trees
PROBE_HEADS = (8, 2, 64)  # the probe's query heads, kv heads and head_dim
PROBE_REPEATS = 5  # timed calls per way; the fastest is kept
F16C = ("-mf16c",)  # a half cache's loads widened by vcvtph2ps (every AVX2 CPU has F16C)
BUILD_FLAGS = (*FLAGS, *F16C)  # the AVX2 build's compiler flags
BUILD_FLAGS_512 = (*FLAGS_512, *F16C)  # the AVX-512 build's

# a way to attend a forward's segments: (qs, keys, values, pasts, visibles, scale, outs), as attend_segments
Attend = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[int], list[torch.Tensor], float,
                   list[torch.Tensor]], None]


def builds() -> list[ModuleType]:
    """The kernel's builds for this CPU (``cext.build``, once per process): AVX-512 where torch reports it,
    and AVX2."""
    found = [build(EXTENSION_512, SOURCE, BUILD_FLAGS_512, CAPABLE_512), build(EXTENSION, SOURCE, BUILD_FLAGS)]
    return [b for b in found if b is not None]


def sdpa_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, visible: torch.Tensor,
              scale: float, out: torch.Tensor) -> None:
    """The same contract as the kernel's ``attend_rows``, by sdpa: ``q`` [1, heads, T, head_dim], ``keys`` and
    ``values`` a request's cache [1, kv_heads, capacity, head_dim], ``visible`` [T, T] bool, ``out``
    [T, heads * head_dim]."""
    n = past + q.shape[2]
    mask = torch.zeros(q.shape[2], n, dtype=q.dtype)  # [T, n]
    mask[:, past:].masked_fill_(~visible, torch.finfo(q.dtype).min)
    seen = F.scaled_dot_product_attention(q, keys[:, :, :n], values[:, :, :n], attn_mask=mask[None, None],
                                          scale=scale, enable_gqa=q.shape[1] != keys.shape[1])  # [1, heads, T, hd]
    out.copy_(seen[0].transpose(0, 1).reshape(q.shape[2], -1))


def sdpa_segments(qs: list[torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor], pasts: list[int],
                  visibles: list[torch.Tensor], scale: float, outs: list[torch.Tensor]) -> None:
    """``attend_segments``' contract by sdpa, one call a segment (``sdpa_rows``)."""
    for q, k, v, past, visible, out in zip(qs, keys, values, pasts, visibles, outs, strict=True):
        sdpa_rows(q, k, v, past, visible, scale, out)


def fastest(ways: Sequence[Attend], repeats: int = PROBE_REPEATS) -> int:
    """Index of the way that attends the ``PROBE`` forward fastest (best of ``repeats`` after one untimed call)."""
    heads, kv_heads, head_dim = PROBE_HEADS
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(1, heads, rows, head_dim, generator=gen) for rows, _ in PROBE]  # each [1, heads, T, head_dim]
    keys, values = ([torch.randn(1, kv_heads, past + rows, head_dim, generator=gen) for rows, past in PROBE]
                    for _ in range(2))  # each [1, kv_heads, past + T, head_dim]
    visibles = [torch.ones(rows, rows, dtype=torch.bool).tril() for rows, _ in PROBE]  # each [T, T]
    outs = [torch.empty(rows, heads * head_dim) for rows, _ in PROBE]  # each [T, heads * head_dim]
    args = (qs, keys, values, [past for _, past in PROBE], visibles, 1.0 / math.sqrt(head_dim), outs)

    def seconds(way: Attend) -> float:
        way(*args)
        best = math.inf
        for _ in range(repeats):
            started = time.perf_counter()
            way(*args)
            best = min(best, time.perf_counter() - started)
        return best

    times = [seconds(way) for way in ways]
    return times.index(min(times))


@functools.cache
def kernel() -> ModuleType | None:
    """The build that attends the segments of forwards of several rows: the fastest of this CPU's builds,
    where it beats sdpa on the probe forward (timed once per process, in the first caller's threads); None
    where sdpa stays."""
    found = builds()
    if not found:
        return None
    best = fastest([sdpa_segments, *(b.attend_segments for b in found)])
    chosen = None if best == 0 else found[best - 1]
    log.info("forwards of several rows attend by %s (timed against %s)", "sdpa" if chosen is None else chosen.__name__,
             ", ".join(["sdpa", *(b.__name__ for b in found)]))
    return chosen


def multi_row(head_dim: int, device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """The build that attends the segments of a forward of several rows with heads ``head_dim`` wide, its
    queries on ``device`` of ``dtype``, or None where they keep sdpa (queries the CPU kernels do not take:
    ``placement.cpu_kernels_ok``; ``kernel`` is None; or its output tile does not divide ``head_dim``).

    ``attend_rows(q, keys, values, past, visible, scale, out)``: ``out`` [T, heads * head_dim] = the T rows of
    ``q`` [1, heads, T, head_dim] (contiguous) attending to a request's cache ``keys``/``values``
    [1, kv_heads, capacity, head_dim]: its first ``past`` entries, and the segment's own T where ``visible``
    [T, T] bool says. ``attend_segments(qs, keys, values, pasts, visibles, scale, outs)``: the same for
    several segments (lists, one item each), in one call: call it through ``attend_segments`` (the guard)."""
    if not cpu_kernels_ok(device, dtype):  # before ``kernel``: such a model never builds or times the kernel
        return None
    ext = kernel()
    return ext if ext is not None and head_dim % ext.tile() == 0 else None


def invariant_rows(head_dim: int, device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """The build a width-invariant model attends every forward with, one-token ones included: ``multi_row``'s
    where it is kept, else this CPU's first build even where sdpa times faster (sdpa's one-row path sums
    otherwise than its masked one, so a row's bits would depend on its forward); None where nothing builds."""
    if not cpu_kernels_ok(device, dtype):
        return None
    found = [b for b in ([kernel()] if kernel() is not None else builds()) if head_dim % b.tile() == 0]
    return found[0] if found else None


def attend_segments(ext: ModuleType, qs: list[torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor],
                    pasts: list[int], visibles: list[torch.Tensor], scale: float, outs: list[torch.Tensor]) -> None:
    """``ext.attend_segments`` (``multi_row``'s contract) once every tensor handed is one the kernel takes
    (``placement.check``: fp32 on the CPU; the caches fp32 or half, the masks on the CPU); else
    ``placement.PlacementError``."""
    check("attention", *qs, *outs)
    check_cache("attention", *keys, *values)
    check_on_cpu("attention", *visibles)
    ext.attend_segments(qs, keys, values, pasts, visibles, scale, outs)
