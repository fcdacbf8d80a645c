"""The project's C++ kernels, compiled at first use by torch's extension builder.

Each kernel is one ``.cpp`` file beside this module, built with g++ and ninja (torch caches the build
per machine under its extensions folder) for CPUs with AVX2 and FMA (AVX-512 for the ones that need it),
and linked to the libgomp torch already loaded, so its ``omp parallel for`` runs in torch's own OpenMP
pool and no second pool competes for the cores. Where a kernel cannot be built it is not offered
(logged once); nothing else changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CAPABLE = ("AVX2", "AVX512")  # torch's CPU capability names whose CPUs have AVX2 and FMA
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")  # the intrinsics, the kernels' omp parallel for
CAPABLE_512 = ("AVX512",)  # torch's CPU capability names whose CPUs have AVX-512 F and DQ
FLAGS_512 = (*FLAGS, "-mavx512f", "-mavx512dq")  # the AVX-512 intrinsics besides


def torch_libgomp() -> list[str]:
    """Link flags for torch's own OpenMP runtime (its soname is libgomp.so.1, so in a process that loaded
    torch the kernel's parallel regions run in torch's pool); plain -fopenmp where torch bundles none."""
    found = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    return [str(found[0])] if found else ["-fopenmp"]


@functools.cache
def build(name: str, source: str | tuple[str, ...], flags: Sequence[str] = FLAGS,
          capable: Sequence[str] = CAPABLE) -> ModuleType | None:
    """The extension ``name`` compiled from ``source`` (a file name beside this module, or several joined
    in order: a kernel, then the glue it shares with another), once per process;
    None where torch's CPU capability is not in ``capable`` (AVX2/FMA by default) or it cannot be built
    (no compiler or ninja: logged once)."""
    if torch.backends.cpu.get_cpu_capability() not in capable:
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        names = (source,) if isinstance(source, str) else source
        text = "\n".join(Path(__file__).with_name(part).read_text() for part in names)
        return load_inline(name, cpp_sources=text, extra_cflags=list(flags), extra_ldflags=torch_libgomp())
    except Exception as exc:  # a missing compiler or ninja: the kernel is not offered, nothing else changes
        log.warning("the %s kernel is not offered (building it failed: %s: %s)", name, type(exc).__name__, exc)
        return None
