"""The project's C++ kernels, compiled once per machine by torch's extension builder.

Each kernel is one ``.cpp`` file beside this module, built with g++ and ninja for CPUs with AVX2 and FMA
(AVX-512 for the ones that need it), and linked to the libgomp torch already loaded, so its ``omp parallel
for`` runs in torch's own OpenMP pool and no second pool competes for the cores.

A build's folder is named by the extension and a hash of everything that shapes its library (the source,
the flags, torch's version, the Python ABI, the machine), so a folder once built (``cext_child.MARKER``) is
loaded as it is, with no compiler, ninja or lock, by every later process. Otherwise the compile runs in a
child process (``cext_child.py``) bounded by ``BUILD_TIMEOUT_S``: it takes a lock a dead process cannot keep
and clears a killed build's torch baton, so a start never waits on a build that is no longer running.
Where a kernel cannot be built in time, or at all, it is not offered (one log line saying why); nothing
else changes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from . import cext_child
from .cext_child import holder, is_built, kill_session, library

log = logging.getLogger(__name__)

CAPABLE = ("AVX2", "AVX512")  # torch's CPU capability names whose CPUs have AVX2 and FMA
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")  # the intrinsics, the kernels' omp parallel for
CAPABLE_512 = ("AVX512",)  # torch's CPU capability names whose CPUs have AVX-512 F and DQ
FLAGS_512 = (*FLAGS, "-mavx512f", "-mavx512dq")  # the AVX-512 intrinsics besides
BUILD_TIMEOUT_S = 300.0  # one kernel's build at most, waiting for another builder included (~30-60 s on 2 cores)
COMPILE_ESTIMATE_S = 30  # what the progress line says a compile takes
KEY_CHARS = 16  # hex digits of the build hash in a build folder's name
ERROR_CHARS = 300  # at most this much of a failed compile's last line goes into the log line
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"  # torch's variable that moves its extensions folder (ours follows it)


def torch_libgomp() -> list[str]:
    """Link flags for torch's own OpenMP runtime (its soname is libgomp.so.1, so in a process that loaded
    torch the kernel's parallel regions run in torch's pool); plain -fopenmp where torch bundles none."""
    found = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    return [str(found[0])] if found else ["-fopenmp"]


@dataclass(frozen=True)
class Spec:
    """Everything one extension's library is made from."""

    name: str  # the extension's module name (TORCH_EXTENSION_NAME)
    text: str  # its C++ source, the parts joined in order
    cflags: tuple[str, ...]  # compiler flags
    ldflags: tuple[str, ...]  # linker flags

    @property
    def directory(self) -> Path:
        """Its build folder: torch's extensions folder, the name and the hash of what shapes the library."""
        shape = [self.text, self.cflags, self.ldflags, torch.__version__, sys.implementation.cache_tag,
                 platform.machine(), os.environ.get("CXX", "c++")]
        key = hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:KEY_CHARS]
        from torch.utils.cpp_extension import get_default_build_root

        root = os.environ.get(EXTENSIONS_ENV) or get_default_build_root()
        return Path(root) / f"{self.name}-{key}"


def spec_of(name: str, source: str | tuple[str, ...], flags: Sequence[str] = FLAGS) -> Spec:
    """The spec of ``build``'s arguments (``source``: file names beside this module, or absolute paths)."""
    names = (source,) if isinstance(source, str) else source
    text = "\n".join((Path(__file__).parent / part).read_text() for part in names)
    return Spec(name, text, tuple(flags), tuple(torch_libgomp()))


def load(spec: Spec) -> ModuleType:
    """Import the built library of ``spec`` (no compiler, no lock)."""
    path = library(spec.directory, spec.name)
    found = importlib.util.spec_from_file_location(spec.name, path)
    if found is None or found.loader is None:
        raise ImportError(f"no module in {path}")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def last_line(text: str) -> str:
    """A failed compile's last non-empty line, cut to ``ERROR_CHARS``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:ERROR_CHARS]


def compile_in_child(spec: Spec, timeout_s: float) -> str | None:
    """Compile ``spec`` in a child process within ``timeout_s``; None when built, else why not (one line)."""
    busy = holder(spec.directory)
    if busy is not None:
        log.info("waiting up to %.0f s for process %s, which is compiling the %s kernel", timeout_s, busy, spec.name)
    log.info("compiling the %s kernel (once per machine, ~%d s)...", spec.name, COMPILE_ESTIMATE_S)
    request = {"parent": os.getpid(), "name": spec.name, "directory": str(spec.directory), "text": spec.text,
               "cflags": list(spec.cflags), "ldflags": list(spec.ldflags)}
    child = subprocess.Popen([sys.executable, "-P", cext_child.__file__], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = child.communicate(json.dumps(request), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(child.pid)  # the child, ninja and the compilers; the kernel frees the child's lock
        child.communicate()
        return f"building it took over {timeout_s:.0f} s"
    return None if child.returncode == 0 else f"building it failed: {last_line(err)}"


@functools.cache
def build(name: str, source: str | tuple[str, ...], flags: Sequence[str] = FLAGS,
          capable: Sequence[str] = CAPABLE) -> ModuleType | None:
    """The extension ``name`` compiled from ``source`` (a file name beside this module, or several joined
    in order: a kernel, then the glue it shares with another), compiled once per machine and loaded once per
    process; None where torch's CPU capability is not in ``capable`` (AVX2/FMA by default) or it cannot be
    built within ``BUILD_TIMEOUT_S`` (no compiler or ninja, a compile error, too slow: logged once)."""
    if torch.backends.cpu.get_cpu_capability() not in capable:
        return None
    try:
        spec = spec_of(name, source, flags)
        if not is_built(spec.directory, name):
            why = compile_in_child(spec, BUILD_TIMEOUT_S)
            if why is not None:
                log.warning("the %s kernel is not offered (%s); the stock kernels serve", name, why)
                return None
        return load(spec)
    except Exception as exc:  # an unreadable source or library: the kernel is not offered, nothing else changes
        log.warning("the %s kernel is not offered (%s: %s); the stock kernels serve", name, type(exc).__name__, exc)
        return None
