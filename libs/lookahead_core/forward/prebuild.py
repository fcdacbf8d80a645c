"""Every C++ kernel the engine may build, in one list, and ``build_all``: compile them where a user waits for
set-up (``lookahead-rag kernels build``, run by ``make setup``), so an engine's first start loads them.

A new kernel appends its ``Kernel`` to ``KERNELS`` (the arguments its module passes to ``cext.build``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from . import attend, gemv, lean_ops, rows
from .cext import CAPABLE, CAPABLE_512, FLAGS, FLAGS_512, build, spec_of
from .cext_child import is_built
from .quant import kernel as quant_kernel


@dataclass(frozen=True)
class Kernel:
    """One ``cext.build`` call: the same arguments, so the build it makes is the one the engine loads."""

    name: str  # the extension's module name
    source: str | tuple[str, ...]  # its source file(s) beside cext.py
    flags: tuple[str, ...] = FLAGS  # compiler flags
    capable: tuple[str, ...] = CAPABLE  # torch CPU capabilities it is built for


KERNELS: list[Kernel] = [  # every kernel the engine may build; append a new one here
    Kernel(attend.EXTENSION_512, attend.SOURCE, attend.BUILD_FLAGS_512, CAPABLE_512),
    Kernel(attend.EXTENSION, attend.SOURCE, attend.BUILD_FLAGS),
    Kernel(rows.EXTENSION_512, rows.SOURCE_512, FLAGS_512, CAPABLE_512),
    Kernel(rows.EXTENSION, rows.SOURCE),
    Kernel(gemv.EXTENSION, gemv.SOURCE, gemv.FLAGS),
    Kernel(lean_ops.EXTENSION, lean_ops.SOURCE, lean_ops.FLAGS),
    *(Kernel(ext, source, tuple(flags), tuple(capable))
      for ext, flags, capable, source in quant_kernel.BUILDS.values()),  # the block kernels' builds
]


def build_one(kernel: Kernel) -> str:
    """Build (or find built) ``kernel``; one word of what happened: built, cached, skipped or failed."""
    if torch.backends.cpu.get_cpu_capability() not in kernel.capable:
        return "skipped"
    try:
        cached = is_built(spec_of(kernel.name, kernel.source, kernel.flags).directory, kernel.name)
    except OSError:  # an unreadable source: build says why
        cached = False
    if build(kernel.name, kernel.source, kernel.flags, kernel.capable) is None:
        return "failed"
    return "cached" if cached else "built"


def build_all(kernels: Sequence[Kernel] | None = None, say: Callable[[str], None] = print) -> int:
    """Build every kernel of ``kernels`` (``KERNELS`` by default), one progress line each; how many failed."""
    kernels = KERNELS if kernels is None else kernels
    failed = 0
    capability = torch.backends.cpu.get_cpu_capability()
    for i, kernel in enumerate(kernels, 1):
        started = time.perf_counter()
        say(f"[{i}/{len(kernels)}] {kernel.name} kernel ...")
        done = build_one(kernel)
        failed += done == "failed"
        note = {"skipped": f"not for this CPU ({capability})", "failed": "not offered (see the line above)",
                "cached": "already built", "built": "compiled"}[done]
        say(f"[{i}/{len(kernels)}] {kernel.name} kernel: {note} ({time.perf_counter() - started:.1f} s)")
    return failed
