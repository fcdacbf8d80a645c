"""What runs on the cores beside the engine's step: CPU seconds of each of this process's threads, by role.

    before = thread_cpu()
    ...                                   # one way at one level
    used = since(before)                  # {"engine": 41.2, "engine's OpenMP workers, gRPC core": 38.0, ...}

Linux only (``/proc/self/task``); elsewhere every figure is empty. Python threads are known by their
name (``threading.enumerate``); threads Python did not start (the engine's OpenMP workers, gRPC's
C-core pollers) are one group. The feedback loop (the in-process bus's consumers, embedding answers,
trie inserts) runs on the event loop and asyncio's workers.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from lookahead_rag.bench.common import print_table

TASKS = Path("/proc/self/task")
UTIME_FIELD = 11  # utime's index among /proc/<pid>/task/<tid>/stat's fields after the ")" of the name
STIME_FIELD = 12  # stime's index among the same fields
ENGINE = "engine"  # the scheduler's step thread
NATIVE = "engine's OpenMP workers, gRPC core"  # threads Python did not start
ROLES = {"step-scheduler": ENGINE, "MainThread": "event loop (gRPC, HTTP, bus)", "asyncio": "asyncio workers"}
OTHER = "other Python threads"


def role(name: str | None) -> str:
    """The group a thread's CPU time is reported under. Example: "asyncio_3" -> "asyncio workers"."""
    if name is None:
        return NATIVE
    for prefix, group in ROLES.items():
        if name.startswith(prefix):
            return group
    return OTHER


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Thread id -> (role, CPU seconds so far, user + system) for every thread of this process."""
    if not TASKS.is_dir():
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for task in TASKS.iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between listing and reading
            continue
        tid = int(task.name)
        out[tid] = (role(names.get(tid)), (int(fields[UTIME_FIELD]) + int(fields[STIME_FIELD])) / ticks)
    return out


def since(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by role used since ``before`` (threads started since count from their start)."""
    used: Counter[str] = Counter()
    for tid, (group, seconds) in thread_cpu().items():
        used[group] += seconds - (before[tid][1] if tid in before else 0.0)
    return {group: round(s, 2) for group, s in sorted(used.items(), key=lambda kv: -kv[1])}


def print_thread_cpu(table: dict[str, dict[str, float]]) -> None:
    """One row per run (e.g. "on@4"), one column per role: CPU seconds."""
    groups = sorted({g for row in table.values() for g in row})
    rows = [{"run": run, **row, "total": sum(row.values())} for run, row in table.items()]
    print("\nCPU seconds by thread, beside and in the engine's steps:")
    print_table(rows, [("run", "run", ""), *[(g, g, ".1f") for g in groups], ("total", "total", ".1f")])
