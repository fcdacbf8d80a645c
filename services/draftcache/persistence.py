"""Crash-safe snapshot files: temp file beside the target, fsync, rename over it, fsync the folder.

A reader sees the complete old snapshot or the complete new one, never a mix; a crash before the
rename leaves a stray ``.<name>.*.tmp`` that the next write does not collide with.
"""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services.common.atomic import write_bytes_atomic as write_file_atomic

__all__ = ["read_file", "write_file_atomic"]


def read_file(path: Path) -> bytes | None:
    """The file's bytes, or None when there is none."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
