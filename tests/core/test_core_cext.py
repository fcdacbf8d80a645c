"""Kernel builds (``forward/cext.py``, ``cext_child.py``): a dead builder's lock never hangs a start, a live
one's never for longer than the bound, and a build happens once per machine (issue 51.11, 52.4).

A kernel of three lines, compiled once for the module into its own extensions folder (~10 s), stands for
the real ones: the same ``cext.build`` compiles it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from lookahead_core.forward import attend, cext, gemv, lean_ops, prebuild, rows
from lookahead_core.forward.cext_child import BATON, LOCK, library

NAME = "lar_test_twice"  # the test kernel's extension name
TINY = """#include <pybind11/pybind11.h>
#include <cstdint>
int64_t twice(int64_t x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
FLAGS = ("-O0",)  # the fastest compile
HERE = (torch.backends.cpu.get_cpu_capability(),)  # this CPU, whatever it is
BOUND_S = 240.0  # a build's bound in these tests: the compile on 2 busy cores, many times over
SHORT_S = 3.0  # the bound when another builder is alive and holds the lock
JOIN_SLACK_S = 60.0  # past the bound, the build must have returned
# a builder that holds the lock and torch's baton as a build would, says so, then waits to be killed
HOLDER = """
import fcntl, os, sys, time
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
fh = open(os.path.join(d, {lock!r}), "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
open(os.path.join(d, {baton!r}), "w").close()
print("held", flush=True)
time.sleep(600)
"""
# a fresh process that builds the same kernel with the compiler and every child process refused
SECOND = """
import subprocess, sys
import torch.utils.cpp_extension as ce
from lookahead_core.forward import cext

def refuse(*args, **kwargs):
    raise AssertionError("the compiler was invoked")

ce._write_ninja_file_and_build_library = refuse
subprocess.Popen = refuse
ext = cext.build({name!r}, {source!r}, {flags!r}, {capable!r})
print(ext.twice(21))
"""


def hold(directory: Path) -> subprocess.Popen[str]:
    """A live process holding ``directory``'s build lock (and torch's baton), once it says so."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(lock=LOCK, baton=BATON), str(directory)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def bounded(call: Callable[[], ModuleType | None], seconds: float) -> ModuleType | None:
    """``call()``'s result, failing the test if it has not returned within ``seconds`` (it would hang)."""
    out: list[ModuleType | None] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"the build did not return within {seconds:.0f} s"
    return out[0]


class Lines(logging.Handler):
    """The log lines of ``cext``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's own extensions folder (TORCH_EXTENSIONS_DIR)."""
    path = tmp_path_factory.mktemp("torch_extensions")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cext.EXTENSIONS_ENV, str(path))
        mp.setattr(cext, "BUILD_TIMEOUT_S", BOUND_S)
        yield path


@pytest.fixture(scope="module")
def source(root: Path) -> Path:
    path = root.parent / "twice.cpp"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def first(root: Path, source: Path) -> tuple[ModuleType | None, list[str]]:
    """The first build, after a builder was killed holding the lock with torch's baton left behind (also
    where torch's own builder looks, ``$TORCH_EXTENSIONS_DIR/<name>/lock``): the module and the log lines."""
    spec = cext.spec_of(NAME, str(source), FLAGS)
    killed = hold(spec.directory)
    killed.kill()
    killed.wait()
    assert (spec.directory / BATON).exists()
    (root / NAME).mkdir()
    (root / NAME / BATON).touch()
    lines = Lines()
    logging.getLogger(cext.__name__).addHandler(lines)
    logging.getLogger(cext.__name__).setLevel(logging.INFO)
    try:
        ext = bounded(lambda: cext.build.__wrapped__(NAME, str(source), FLAGS, HERE), BOUND_S + JOIN_SLACK_S)
    finally:
        logging.getLogger(cext.__name__).removeHandler(lines)
    return ext, lines.lines


def test_a_builder_killed_holding_the_lock_never_hangs_the_next_build(first: tuple[ModuleType | None, list[str]]):
    ext, lines = first
    assert ext is not None and ext.twice(21) == 42
    assert any(f"compiling the {NAME} kernel (once per machine" in line for line in lines), lines


def test_a_second_process_loads_the_built_kernel_without_compiling(first: tuple[ModuleType | None, list[str]],
                                                                   source: Path, root: Path):
    directory = cext.spec_of(NAME, str(source), FLAGS).directory
    before = {p.name: p.stat().st_mtime_ns for p in (library(directory, NAME), directory / "build.ninja")}
    code = SECOND.format(name=NAME, source=str(source), flags=FLAGS, capable=HERE)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=BOUND_S,
                          env={**os.environ, cext.EXTENSIONS_ENV: str(root)}, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr[-2000:]
    assert {p.name: p.stat().st_mtime_ns for p in (library(directory, NAME), directory / "build.ninja")} == before


def test_a_live_builder_holding_the_lock_makes_a_build_refused_within_the_bound(
        root: Path, source: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    other = source.with_name("twice_other.cpp")
    other.write_text(TINY + "// another source, another build\n")
    live = hold(cext.spec_of(NAME, str(other), FLAGS).directory)
    monkeypatch.setattr(cext, "BUILD_TIMEOUT_S", SHORT_S)
    try:
        with caplog.at_level(logging.WARNING, logger=cext.__name__):
            ext = bounded(lambda: cext.build.__wrapped__(NAME, str(other), FLAGS, HERE), SHORT_S + JOIN_SLACK_S)
    finally:
        live.kill()
        live.wait()
    assert ext is None
    said = [r.getMessage() for r in caplog.records if r.name == cext.__name__ and r.levelno == logging.WARNING]
    assert len(said) == 1 and f"took over {SHORT_S:.0f} s" in said[0] and "stock kernels serve" in said[0], said


def test_the_prebuild_list_holds_every_build_the_engine_asks_for(monkeypatch: pytest.MonkeyPatch):
    asked: set[tuple[str, object, tuple[str, ...], tuple[str, ...]]] = set()

    def record(name: str, source: object, flags: tuple[str, ...] = cext.FLAGS,
               capable: tuple[str, ...] = cext.CAPABLE) -> None:
        asked.add((name, source, tuple(flags), tuple(capable)))

    for module in (attend, gemv, rows, lean_ops):
        monkeypatch.setattr(module, "build", record)
    attend.builds()
    gemv.extension()
    rows.avx2_extension()
    rows.avx512_extension()
    lean_ops.extension()
    listed = {(k.name, k.source, tuple(k.flags), tuple(k.capable)) for k in prebuild.KERNELS}
    assert len(asked) == 6 and asked <= listed, asked - listed
