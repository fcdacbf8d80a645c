"""bench/thread_cpu.py: CPU seconds of this process's threads, grouped by role."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from lookahead_rag.bench.thread_cpu import ENGINE, NATIVE, OTHER, role, since, thread_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def test_role_groups_threads_by_name() -> None:
    assert role("step-scheduler") == ENGINE  # the engine's step thread
    assert role("asyncio_3") == "asyncio workers"  # asyncio.to_thread's pool
    assert role("MainThread") == "event loop (gRPC, HTTP, bus)"
    assert role("kafka-poller") == OTHER  # any other Python thread
    assert role(None) == NATIVE  # a thread Python did not start (OpenMP workers, gRPC core)


def test_a_busy_thread_shows_under_its_role() -> None:
    busy_done, stop = threading.Event(), threading.Event()

    def spin_then_wait() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:  # a third of a second of this thread's own CPU
            sum(range(1000))
        busy_done.set()
        stop.wait(10)  # still alive when it is measured

    before = thread_cpu()
    assert before and all(seconds >= 0 for _, seconds in before.values())
    worker = threading.Thread(target=spin_then_wait, name="step-scheduler")
    worker.start()
    try:
        assert busy_done.wait(10)
        used = since(before)
    finally:
        stop.set()
        worker.join()
    assert used[ENGINE] >= 0.2  # its 0.3 s, less clock-tick rounding
    assert used.get("asyncio workers", 0.0) < 0.1  # no such thread was busy here
