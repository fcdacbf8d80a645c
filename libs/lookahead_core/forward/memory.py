"""What the process holds in memory, and handing freed memory back to the system.

Twins that lose the start-up measurement are dropped (``KernelSet.calibrate``); their packed weights
(hundreds of MB on a 0.5B model) were allocated in pieces that glibc may keep on its free lists
instead of returning them, so the process's resident memory would not go down. ``release_freed``
asks glibc to return them (``malloc_trim``; a no-op where there is no glibc). ``resident`` reads the
process's resident memory split as the kernel reports it: anonymous (heap: packed weights, KV,
activations) and file-backed (memory-mapped weights, libraries). ``drop_file_pages`` lets go of the
pages of memory-mapped weights that were copied elsewhere (``fused.fuse_weights``): the mapping of the
safetensors file stays while any weight in it lives, so without it each copied weight would stay
resident twice (measured on SmolLM2-135M: 276 MB of q/k/v and gate/up counted both as file and heap).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import mmap
from dataclasses import dataclass
from pathlib import Path

STATUS = Path("/proc/self/status")  # Linux: the process's memory counters, in kB
MAPS = Path("/proc/self/maps")  # Linux: the process's mappings, one a line
KIB = 1024  # bytes per kB in /proc
MADV_DONTNEED = 4  # Linux madvise(): drop these pages (a file mapping's come back from the file if touched)


@dataclass(frozen=True)
class Resident:
    """Resident memory of this process, in bytes (0 where /proc is not there)."""

    total: int  # VmRSS: everything resident
    anon: int  # RssAnon: heap and anonymous mappings (the weights' copies, KV, activations)
    file: int  # RssFile: file-backed pages (memory-mapped safetensors weights, shared libraries)


def resident() -> Resident:
    """The process's resident memory now (from /proc/self/status)."""
    fields: dict[str, int] = {}
    try:
        for line in STATUS.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * KIB
    except OSError:
        pass
    return Resident(fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssFile", 0))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed() -> bool:
    """Collect garbage and return malloc's free memory to the system; whether glibc did it."""
    gc.collect()
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of every mapping of a file (a path and an inode), from /proc/self/maps."""
    spans = []
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            spans.append((start, end))
    return spans


def drop_file_pages(spans: list[tuple[int, int]]) -> int:
    """Drop the resident pages wholly inside each (address, bytes) span that lies in a mapping of a file
    (memory-mapped weights whose values now live elsewhere); returns the bytes dropped. Only file-backed
    memory is touched: a page touched again is read back from the file, never zeros."""
    libc = _libc()
    if libc is None or not spans:
        return 0
    page = mmap.PAGESIZE
    files = _file_mappings()
    dropped = 0
    for addr, size in spans:
        lo, hi = -(-addr // page) * page, (addr + size) // page * page  # whole pages inside the span
        inside = hi > lo and any(start <= lo and hi <= end for start, end in files)
        if inside and libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED) == 0:
            dropped += hi - lo
    return dropped
