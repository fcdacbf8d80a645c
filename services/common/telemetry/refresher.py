"""``Refresher``: keeps gauges and counters sampled from state current (a bus's ``stats()``, trie
sizes, the engine's queue) by running cheap jobs every few seconds off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


class Refresher:
    """Runs ``jobs`` (cheap samplers: counters, depths, dirty sizes) every ``interval_s`` in a worker
    thread, so a slow one never blocks the event loop; a failing job is logged and retried next time.

        refresher = Refresher(5.0, consumer_jobs(bus, ["draftcache"], ConsumerMetrics.of(registry)))
        await refresher.start() ... await refresher.stop()     # refresher.refresh_now() in tests
    """

    def __init__(self, interval_s: float, jobs: Iterable[Callable[[], object]] = ()) -> None:
        self.interval_s = interval_s
        self.jobs: list[Callable[[], object]] = list(jobs)
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one round at a time (the task and refresh_now)

    def add(self, job: Callable[[], object]) -> None:
        self.jobs.append(job)

    def refresh_now(self) -> None:
        with self._lock:
            for job in self.jobs:
                try:
                    job()
                except Exception:  # a metric must never take a service down
                    log.exception("metrics refresh job %r failed", job)

    async def start(self) -> None:
        if self._task is None and self.jobs:
            self._task = asyncio.create_task(self._run(), name="metrics-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.to_thread(self.refresh_now)
            await asyncio.sleep(self.interval_s)
