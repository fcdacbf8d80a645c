"""Crash-safe file replacement (indexes, snapshots, consumer state): write a temp file beside the target,
fsync it, rename it over, fsync the directory.

A reader sees either the complete old file or the complete new one, never a mix; a crash before
the rename leaves only a stray ``.<name>.*.tmp`` file, which ``remove_stale_temps`` clears.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with what ``write(fh)`` writes, atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_bytes_atomic(path: Path, data: bytes) -> int:
    """Replace ``path`` with ``data`` atomically and durably; returns the bytes written."""
    write_atomic(path, lambda fh: fh.write(data))
    return len(data)


def remove_stale_temps(directory: Path) -> int:
    """Delete temp files a crash left behind; returns how many."""
    if not directory.is_dir():
        return 0
    removed = 0
    for stale in directory.glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed += 1
    return removed
