"""One thread per process runs torch's parallel work: the engine's. Every other thread runs torch on one.

PyTorch's CPU build parallelizes each op with OpenMP (libgomp on Linux). libgomp gives every thread
that opens a parallel region with 2+ threads its own pool of worker threads, kept until that thread
exits. While the process holds more such threads than CPUs, libgomp throttles every pool: between two
regions its workers spin 100 times instead of ~300k and then sleep on a futex, so each of a forward's
hundreds of regions (every Linear, norm and elementwise op) pays a wake-up. Measured (2-core AMD EPYC,
SmolLM2-135M fp32, a one-token forward over a 300-token cache, 2 threads): 44 ms (row-split Linear) /
57 ms (stock) when the forward's thread held the only pool; 94 ms / 83 ms on a worker thread once the
main thread had run a 2-thread op too. A service runs torch on many threads (model loading, the
retriever's embeddings, asyncio's executor), so the rule is:

- the engine's step thread sets its intra-op threads itself (``SchedulerConfig.threads``,
  ``claim_threads``) and is the only long-lived thread with more than one;
- a process that serves sets torch's default to one thread first (``serve_single_threaded``), so
  every other thread, created before or after the engine, stays out of OpenMP pools;
- a baseline that must also run with several threads (the benchmarks' HF ``generate``) runs on a
  thread of its own that exits when done (``on_own_thread``), which frees its pool.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

T = TypeVar("T")

BACKGROUND_THREADS = 1  # intra-op threads of every thread but the engine's


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, so a container's CPU set counts, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def serve_single_threaded() -> None:
    """Make one intra-op thread torch's count for this thread and the default of every thread started
    after it. Call it once at a serving process's start, before loading models or embedders."""
    torch.set_num_threads(BACKGROUND_THREADS)


def _on_fresh_thread(fn: Callable[[], T], name: str = "torch-threads") -> T:
    """``fn()`` on a new thread, which then exits; blocks, and returns its result or raises its exception."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            err.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if err:
        raise err[0]
    return out[0]


def new_thread_default() -> int:
    """Intra-op threads a thread started now would run torch ops with (torch keeps one process-wide
    default: the last count any thread set)."""
    return _on_fresh_thread(torch.get_num_threads)


def claim_threads(n: int) -> None:
    """This thread runs torch ops on ``n`` threads from now on; threads started later keep the default
    they had (``torch.set_num_threads`` alone would make ``n`` everyone's default)."""
    default = new_thread_default()
    torch.get_num_threads()  # torch's per-thread lazy start-up first, or it would read the default back later
    torch.set_num_threads(n)
    if default != n:
        _on_fresh_thread(lambda: torch.set_num_threads(default))  # the default only: that thread exits


def on_own_thread(fn: Callable[[], T], threads: int, name: str = "torch-baseline") -> T:
    """``fn()`` on a new thread with ``threads`` intra-op threads, which then exits (and frees its
    OpenMP pool); blocks until it is done and returns its result or raises its exception."""

    def run() -> T:
        claim_threads(threads)
        return fn()

    return _on_fresh_thread(run, name)


def start_compute_thread(setup: Callable[[], None], loop: Callable[[], None], threads: int,
                         name: str) -> threading.Thread:
    """Start the process's compute thread: it claims ``threads`` intra-op threads, runs ``setup()``
    (e.g. timing kernels, which must run where the forwards will), then ``loop()``. Returns once
    ``setup`` is done, raising its exception here if it failed (the thread then ends)."""
    failed: list[BaseException] = []
    ready = threading.Event()

    def run() -> None:
        try:
            claim_threads(threads)
            setup()
        except BaseException as exc:  # re-raised on the starting thread
            failed.append(exc)
            return
        finally:
            ready.set()
        loop()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    if failed:
        raise failed[0]
    return thread


class CallQueue:
    """Callables handed to the compute thread by other threads, run there between its own work.

    A baseline timed beside the engine must run where the engine's forwards run: on another thread
    it would open a second OpenMP pool and both would be throttled.
    """

    def __init__(self) -> None:
        self._pending: deque[tuple[Callable[[], Any], Future[Any]]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` (the caller wakes the compute thread); its Future gets the result or exception."""
        future: Future[T] = Future()
        self._pending.append((fn, future))
        return future

    def run_pending(self) -> None:
        """Run every queued callable on this thread, in order."""
        while self._pending:
            fn, future = self._pending.popleft()
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller's future raises it
                future.set_exception(exc)
