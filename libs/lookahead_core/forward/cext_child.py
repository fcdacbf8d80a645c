"""One kernel's compile, run as a child process of ``cext.build`` (``python -P cext_child.py``, the spec on stdin).

The child takes the build folder's lock (``fcntl.flock`` on ``build.lock``: the kernel releases it when its
holder dies, so a killed build never keeps it), and holding it, removes torch's own baton file (``lock``,
which torch's builder leaves behind when it is killed and then waits on for ever: nobody else can be
building), compiles with torch's builder, and marks the folder built (``built``, written last, so a folder
without it is never loaded). It kills its own process group (itself, ninja, the compiler) when its parent
dies (every process of its session: ninja puts each compiler in a process group of its own), so no
orphaned compile outlives the engine that asked for it. Standalone (stdlib and torch only): the
parent's helpers are imported from here, never the other way round.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = "build.lock"  # our lock file in a build folder (flock: released when its holder dies)
BATON = "lock"  # torch's FileBaton file in the same folder (left behind by a killed build)
MARKER = "built"  # written once the extension compiled and imported: the folder may be loaded as it is
LIB_SUFFIX = ".so"  # the extension's file name is its module name and this
WATCH_S = 1.0  # how often the child looks whether its parent is still alive
SESSION_FIELD = 3  # /proc/<pid>/stat's session id, counted from the field after the command's name


def library(directory: Path, name: str) -> Path:
    """The compiled extension ``name`` of ``directory``."""
    return directory / f"{name}{LIB_SUFFIX}"


def is_built(directory: Path, name: str) -> bool:
    """Whether ``directory`` holds a finished build of ``name`` (its marker and its library)."""
    return (directory / MARKER).is_file() and library(directory, name).is_file()


def mark_built(directory: Path) -> None:
    """Write the marker atomically (a reader sees it whole or not at all)."""
    part = directory / f"{MARKER}.{os.getpid()}"
    part.write_text(f"{time.time()}\n")
    part.replace(directory / MARKER)


def holder(directory: Path) -> int | None:
    """The pid of a live process holding ``directory``'s lock, None where nobody holds it."""
    path = directory / LOCK
    if not path.exists():
        return None
    with path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            text = fh.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock (waiting for a live holder; a dead one's lock is already gone), its file
    naming this process; with it held, no stale torch baton is left in the folder."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / LOCK).open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
            (directory / BATON).unlink(missing_ok=True)  # a killed build's: nobody else can be building
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` (the child, ninja, and the compilers ninja puts in process groups
    of their own), this one last where it is one of them."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp sid
        except (OSError, IndexError):  # not a process, or gone
            continue
        if entry.name.isdigit() and int(fields[SESSION_FIELD]) == session:
            found.append(int(entry.name))
    for pid in sorted(found, key=lambda pid: pid == os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def watch_parent(parent: int) -> None:
    """Kill this child's session (itself, ninja, the compilers) once ``parent`` is gone."""
    def run() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        kill_session(os.getsid(0))

    threading.Thread(target=run, name="cext-watch-parent", daemon=True).start()


def compile_here(name: str, directory: Path, text: str, cflags: list[str], ldflags: list[str]) -> None:
    """Compile ``text`` as extension ``name`` in ``directory`` unless it is built there already."""
    with locked(directory):
        if is_built(directory, name):
            return
        from torch.utils.cpp_extension import load_inline

        load_inline(name, cpp_sources=text, extra_cflags=cflags, extra_ldflags=ldflags,
                    build_directory=str(directory), no_implicit_headers=True)  # each source includes its own
        mark_built(directory)


def main() -> int:
    spec = json.load(sys.stdin)
    watch_parent(int(spec["parent"]))
    compile_here(spec["name"], Path(spec["directory"]), spec["text"], spec["cflags"], spec["ldflags"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
