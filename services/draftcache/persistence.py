"""Crash-safe snapshot files: temp file beside the target, fsync, rename over it, fsync the folder.

A reader sees the complete old snapshot or the complete new one, never a mix; a crash before the
rename leaves a stray ``.<name>.*.tmp`` that the next write does not collide with.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def write_file_atomic(path: Path, data: bytes) -> int:
    """Replace ``path`` with ``data`` atomically and durably; returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(data)


def read_file(path: Path) -> bytes | None:
    """The file's bytes, or None when there is none."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
