"""bench hostile's attackers in a process of their own, as clients on another host would be: their own
serialization (a 6 MiB message built and sent per refused call) never holds the serving process's GIL.

    python -m lookahead_rag.bench.hostile_attack SPEC.json OUT.json

SPEC (``AttackSpec.to_json``): the doors, the uploader's tenant and key, the plan's sizes, the passages its
text repeats, the holder's shape, and which attackers run. SIGUSR1: the victim's run is over, the refused
uploads and the held streams stop, an accepted upload being embedded is let finish (then the process
ends); SIGTERM (or the bench process gone): everything stops at once. Either way OUT gets the counts
(``counts_json``) before exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lookahead_rag.bench.hostile_mix import (
    MIB,
    Doors,
    HoldCounts,
    UploadCounts,
    UploadPlan,
    accept_loop,
    filler_text,
    holder,
    refuse_loop,
)

SAMPLE_S = 1.0  # how often the holder's held streams are counted


@dataclass(frozen=True)
class AttackSpec:
    """What the attacker process runs."""

    doors: Doors  # where it knocks
    tenant: str  # the uploader's tenant
    key: str  # the uploader's key (write scope)
    passages: list[str]  # real prose the uploads repeat
    doc_mib: float  # every upload's text, MiB
    title_mib: float  # the refused uploads' title, MiB
    http_body_bytes: int  # the OpenAI door's body limit
    victim: str  # the tenant the holder's streams name
    hold_connections: int  # the holder's connections
    hold_streams: int  # streams each holds
    attackers: list[str]  # a subset of refuse, accept, hold

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AttackSpec:
        raw = json.loads(text)
        return cls(**(raw | {"doors": Doors(**raw["doors"])}))

    def plan(self) -> UploadPlan:
        return UploadPlan(self.tenant, filler_text(self.passages, int(self.doc_mib * MIB)),
                          int(self.title_mib * MIB), self.http_body_bytes)


def counts_json(refused: UploadCounts, accepted: UploadCounts, holds: HoldCounts) -> dict[str, Any]:
    """What OUT holds: each attacker's counts."""
    return {"refused": refused.as_json(), "accepted": accepted.as_json(), "holder": holds.as_json()}


async def sample_held(counts: HoldCounts) -> None:
    """The holder's streams held, once a SAMPLE_S, until cancelled."""
    while True:
        counts.samples.append(counts.held())
        await asyncio.sleep(SAMPLE_S)


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def orphaned(parent: int, now: asyncio.Event) -> None:
    """Set ``now`` once ``parent`` is gone (killed before it could signal): no attacker outlives its bench."""
    while os.getppid() == parent:
        await asyncio.sleep(SAMPLE_S)
    now.set()


async def attack(spec: AttackSpec, out: Path) -> None:
    refused, accepted, holds = UploadCounts(), UploadCounts(), HoldCounts()
    plan = spec.plan()
    others: list[asyncio.Task[None]] = []
    accepting: list[asyncio.Task[None]] = []
    if "accept" in spec.attackers:
        accepting.append(asyncio.create_task(accept_loop(spec.doors, spec.key, plan, accepted)))
    if "refuse" in spec.attackers:
        others.append(asyncio.create_task(refuse_loop(spec.doors, spec.key, plan, refused)))
    if "hold" in spec.attackers:
        others += [asyncio.create_task(holder(spec.doors.grpc, spec.victim, spec.hold_connections,
                                              spec.hold_streams, holds)), asyncio.create_task(sample_held(holds))]
    victim_done, now = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, victim_done.set)
    loop.add_signal_handler(signal.SIGTERM, now.set)
    waits = [asyncio.create_task(victim_done.wait()), asyncio.create_task(now.wait()),
             asyncio.create_task(orphaned(os.getppid(), now))]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    await stop(others)
    while not now.is_set() and accepting and not accepted.outcomes:  # an accepted upload finishes embedding
        await asyncio.wait([waits[1], *accepting], timeout=SAMPLE_S, return_when=asyncio.FIRST_COMPLETED)
    await stop(accepting + waits)
    out.write_text(json.dumps(counts_json(refused, accepted, holds)))


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = argv if argv is not None else sys.argv[1:]
    asyncio.run(attack(AttackSpec.from_json(Path(spec_path).read_text()), Path(out_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
