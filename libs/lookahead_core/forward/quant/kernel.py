"""Which build of the block kernel (``qlinear.cpp``) this process runs: one that runs here, the faster one.

A CPU may advertise an instruction set it cannot run (one host's CPU lists AMX, and an AMX instruction
faults there), so a build is never chosen from cpuid flags alone: each build this CPU's torch capability
allows (AVX-512, AVX2) is first run in a child process on a small product checked against numpy
(``selftest``); only a build whose child exits cleanly is loaded here, and of those the faster on a
one-token product of a model-sized weight is kept. One build serves every forward of the process, so a
row's bits never depend on which build ran it. Where none passes the quantized weights are refused in one
line (``load.py``), never served wrong.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from ...defaults import cache_dir
from .. import cext
from ..cext import CAPABLE, CAPABLE_512, FLAGS, FLAGS_512, build

log = logging.getLogger(__name__)

SOURCE = "qlinear.cpp"  # the fp32 kernel (C++, intrinsics, OpenMP), in forward/ beside the other kernels
INT8_SOURCE = "qdot.cpp"  # the int8-activation kernel (AVX-512 VNNI), beside it
VNNI_FLAGS = (*FLAGS_512, "-mavx512bw", "-mavx512vl", "-mavx512vnni")  # the int8 kernel's intrinsics
BUILDS = {  # build name -> (torch extension name, compiler flags, torch CPU capabilities that may run it, source)
    "avx512": ("lookahead_qlinear512", (*FLAGS_512, "-mavx512bw", "-mavx512vl"), CAPABLE_512, SOURCE),
    "avx2": ("lookahead_qlinear", FLAGS, CAPABLE, SOURCE),
    "vnni512": ("lookahead_qdot512", VNNI_FLAGS, CAPABLE_512, INT8_SOURCE),
    "amx512": ("lookahead_qdot_amx", (*VNNI_FLAGS, "-mamx-tile", "-mamx-int8"), CAPABLE_512, INT8_SOURCE),
}
FLOAT_BUILDS = ("avx512", "avx2")  # builds of the fp32 kernel, the faster that runs here serves
INT8_BUILDS = ("amx512", "vnni512")  # builds of the int8-activation kernel, the first that runs here serves
# (the same bits either way: AMX only moves the cost of several rows)
SELFTEST_TIMEOUT_S = 600.0  # a child's build (first use: a compile) and check, at most
SELFTEST_SHAPE = (5, 64, 96)  # the child's product: rows, out, in
PROBE_SHAPE = (4096, 1024)  # the timing probe's weight [out, in]: past the cores' L2, as a model's are
PROBE_REPEATS = 5  # timed calls per build; the fastest is kept
FMT = {"u4": 0, "i8": 1, "f32": 2}  # the code layouts in the kernel's numbering
VERDICTS = "kernel-verdicts"  # folder under the cache: a build's self-test verdict on this machine
VERDICT_KEY_CHARS = 16  # hex digits of the verdict's key (source, flags, torch, CPU)
PASSED, FAULTED = "pass", "fault"  # what a kept verdict says


def extension(name: str) -> ModuleType | None:
    """Build ``name`` of ``BUILDS`` (``cext.build``: compiled once per machine, loaded once per process)."""
    ext, flags, capable, source = BUILDS[name]
    return build(ext, source, flags, capable)


def selftest(name: str) -> int:
    """Run build ``name`` on a small random product of each code layout and compare with numpy; 0 when
    every output is within fp32 rounding of the float64 product (the child's exit code)."""
    ext = extension(name)
    if ext is None:
        return 2
    if name in INT8_BUILDS:
        from .qdot import selftest as int8_selftest

        return int8_selftest(ext)
    rows, out, cols = SELFTEST_SHAPE
    gen = np.random.default_rng(0)
    x = gen.standard_normal((rows, cols)).astype(np.float32)
    scales = gen.random((out, cols // 32)).astype(np.float32)
    offsets = gen.standard_normal((out, cols // 32)).astype(np.float32)
    codes = gen.integers(0, 16, (out, cols)).astype(np.uint8)
    from .blocks import pack_u4

    ref = (np.repeat(scales, 32, 1) * codes + np.repeat(offsets, 32, 1)).astype(np.float64) @ x.T.astype(np.float64)
    got = ext.qlinear(torch.from_numpy(x), torch.from_numpy(pack_u4(codes)), torch.from_numpy(scales),
                      torch.from_numpy(offsets), None, 32, FMT["u4"]).numpy()
    bound = 1e-4 * (np.abs(ref).max() + 1.0)
    return 0 if np.abs(got - ref.T).max() <= bound else 1


def verdict_path(name: str) -> Path:
    """Where build ``name``'s self-test verdict on this machine is kept: keyed by the source, the flags, torch
    and the CPU (its model and flags as the kernel reports them), so any change tests again."""
    ext, flags, _, source = BUILDS[name]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    described = {line.split(":", 1)[0].strip(): line for line in cpu.splitlines() if ":" in line}
    parts = [Path(cext.__file__).with_name(source).read_bytes(), " ".join(flags).encode(), torch.__version__.encode(),
             described.get("model name", "").encode(), described.get("flags", "").encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:VERDICT_KEY_CHARS]
    return cache_dir() / VERDICTS / f"{ext}-{key}"


@functools.cache
def runs_here(name: str) -> bool:
    """Whether build ``name`` runs on this CPU: its self-test passes in a child process (a fault there, such as
    an illegal instruction, ends the child, not this process). A pass or a fault is kept on disk
    (``verdict_path``), so later starts on this machine spawn no child; a timeout or a failed check is not."""
    _, _, capable, _ = BUILDS[name]
    if torch.backends.cpu.get_cpu_capability() not in capable:
        return False
    kept = verdict_path(name)
    if kept.exists():
        return kept.read_text().strip() == PASSED
    passed = _child_selftest(name)
    if passed is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(PASSED if passed else FAULTED)
    return bool(passed)


def _child_selftest(name: str) -> bool | None:
    """True: the child's self-test passed; False: a signal ended it (the build faults here); None: anything
    else (a timeout, a failed check, no build), not kept."""
    code = f"import sys; from {__name__} import selftest; sys.exit(selftest({name!r}))"
    try:
        done = subprocess.run([sys.executable, "-c", code], timeout=SELFTEST_TIMEOUT_S, capture_output=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    except subprocess.TimeoutExpired:
        log.warning("the %s block kernel is not offered: its self-test took over %.0f s", name, SELFTEST_TIMEOUT_S)
        return None
    if done.returncode != 0:
        why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        log.warning("the %s block kernel is not offered: its self-test failed in a child process (%s)", name, why)
    return True if done.returncode == 0 else False if done.returncode < 0 else None


@functools.cache
def kernel() -> ModuleType | None:
    """The build every quantized product of this process runs: of those that run here, the faster on a
    one-token product (timed once, in the first caller's threads); None where none runs."""
    found = {name: ext for name in FLOAT_BUILDS if runs_here(name) and (ext := extension(name)) is not None}
    if not found:
        return None
    if len(found) == 1:
        return next(iter(found.values()))
    out, cols = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, cols, generator=gen)  # [1, in]
    codes = torch.randint(0, 256, (out, cols // 2), dtype=torch.uint8, generator=gen)  # [out, in / 2]
    scales = torch.rand(out, cols // 32, generator=gen)  # [out, groups]

    def seconds(ext: ModuleType) -> float:
        ext.qlinear(x, codes, scales, scales, None, 32, FMT["u4"])
        best = math.inf
        for _ in range(PROBE_REPEATS):
            started = time.perf_counter()
            ext.qlinear(x, codes, scales, scales, None, 32, FMT["u4"])
            best = min(best, time.perf_counter() - started)
        return best

    times = {name: seconds(ext) for name, ext in found.items()}
    chosen = min(times, key=times.__getitem__)
    log.info("quantized products by the %s block kernel (timed against %s)", chosen, ", ".join(times))
    return found[chosen]
