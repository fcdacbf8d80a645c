"""The fuzz driver: N cases against every RPC, each judged, the server watched throughout.

    report = run_fuzz(FuzzOptions(cases=200, workdir=tmp_path))
    assert report.failed == 0

Per RPC: the fixed cases (empty, oversize, deep nesting), then hypothesis-drawn cases
(``tests.fuzz.cases``) until ``cases`` are done. Each call has ``deadline_s``; after any failure or
slow call, and every ``health_every`` cases, the driver checks the server: a dead process is a
CRASH (the server is restarted and the run goes on), a server that no longer answers health checks
a HANG. Afterwards: health, calls drained on the server, and the normal requests (``probes``).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from tests.fuzz.cases import Case, case_strategy, fixed_cases
from tests.fuzz.credentials import auth_class, credential
from tests.fuzz.outcome import FAILURES, Judgement, RpcTally, Verdict, judge
from tests.fuzz.probes import ProbeResult, drained, healthy, normal_requests
from tests.fuzz.process import ServerProcess
from tests.fuzz.targets import CallResult, Rpc, discover, invoke
from tests.fuzz.values import FuzzDictionary

DEFAULT_DEADLINE_S = 10.0  # per call; DEADLINE_EXCEEDED on it is "slow"
DEFAULT_MARGIN_S = 10.0  # no answer by deadline + margin is a hang
DEFAULT_HEALTH_EVERY = 250  # cases between health checks
BATCH = 10  # cases drawn per hypothesis example: the engine's per-example work is most of a small case's cost
MAX_ROUNDS = 20  # hypothesis runs per RPC to reach the case count (one normally does)
SEED_BITS = 32


@dataclass
class FuzzOptions:
    workdir: Path
    cases: int = 200
    deadline_s: float = DEFAULT_DEADLINE_S
    margin_s: float = DEFAULT_MARGIN_S
    seed: int | None = None
    only: tuple[str, ...] = ()  # RPC names containing any of these (empty: every RPC)
    health_every: int = DEFAULT_HEALTH_EVERY
    seconds_per_rpc: float | None = None  # stop an RPC's cases after this long (None: run them all)
    server_args: list[str] = field(default_factory=list)


@dataclass
class Report:
    options: FuzzOptions
    seed: int
    tallies: list[RpcTally] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # crashes, restarts, hangs, as they happened
    restarts: int = 0
    seconds: float = 0.0
    server_logs: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.tallies) + sum(not p.ok for p in self.probes)


def _drive(strategy: st.SearchStrategy[Case], body: Callable[[Case], None], cases: int, seed: int) -> None:
    """Draw about ``cases`` cases, ``BATCH`` per hypothesis example (its per-example cost is shared)."""

    @hypothesis_seed(seed)
    @settings(max_examples=max(1, math.ceil(cases / BATCH)), database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(st.lists(strategy, min_size=BATCH, max_size=BATCH))
    def run(batch: list[Case]) -> None:
        for case in batch:
            body(case)

    run()


class RpcFuzzer:
    """Runs one RPC's cases against the server and counts them."""

    def __init__(self, server: ServerProcess, rpc: Rpc, options: FuzzOptions, report: Report) -> None:
        self.server, self.rpc, self.options, self.report = server, rpc, options, report
        self.tally = RpcTally(rpc.name, rpc.service)
        self.save_dir = options.workdir / "failures"
        self.started = time.monotonic()

    @property
    def out_of_time(self) -> bool:
        budget = self.options.seconds_per_rpc
        return budget is not None and time.monotonic() - self.started > budget

    def one(self, case: Case) -> None:
        opts = self.options
        if self.out_of_time:
            return  # hypothesis draws the rest of its examples; none is sent (a raise would print the case)
        assert self.server.info is not None
        variant, metadata = credential(self.tally.cases, self.server.info.api_key)
        case = dataclasses.replace(case, classes=case.classes | auth_class(variant))
        result = invoke(self.server.channel(self.rpc.service), self.rpc, case.payload, opts.deadline_s, metadata)
        judgement = judge(self.rpc, result, opts.deadline_s, opts.margin_s)
        due = (self.tally.cases + 1) % opts.health_every == 0
        if judgement.verdict in FAILURES or judgement.verdict is Verdict.SLOW or due:
            judgement = self._check_server(judgement)
        self.tally.add(case, result, judgement, self.save_dir)

    def _check_server(self, judgement: Judgement) -> Judgement:
        """A dead server makes the case a CRASH, an unresponsive one a HANG; either is restarted."""
        server = self.server
        if server.alive():
            health = healthy(server)
            if health.ok:
                return judgement
            judgement = Judgement(Verdict.HANG, f"the server stopped answering health checks: {health.detail}")
        else:
            judgement = Judgement(Verdict.CRASH, f"the server process exited ({server.exit_code()})")
        self.report.events.append(f"{self.rpc.name} case {self.tally.cases + 1}: {judgement.reason}; "
                                  f"log {server.log_path}; restarting")
        self.report.server_logs.append(str(server.log_path))
        self.report.restarts += 1
        server.restart()
        return judgement

    def run(self, words: FuzzDictionary, seed: int) -> RpcTally:
        assert self.server.info is not None
        for case in fixed_cases(self.server.info.max_message_bytes[self.rpc.service]):
            self.one(case)
        strategy = case_strategy(self.rpc.input, words)
        for round_ in range(MAX_ROUNDS):
            before, missing = self.tally.cases, self.options.cases - self.tally.cases
            if missing <= 0:
                break
            _drive(strategy, self.one, missing, seed + round_)
            if self.tally.cases == before or self.out_of_time:  # nothing more to draw, or no time
                break
        return self.tally


def dictionary(server: ServerProcess) -> FuzzDictionary:
    assert server.info is not None
    return FuzzDictionary.of(server.info.strings, server.info.ints)


def selected(rpcs: list[Rpc], only: tuple[str, ...]) -> list[Rpc]:
    return [r for r in rpcs if not only or any(o in r.name for o in only)]


def replay(options: FuzzOptions, rpc_name: str, payload: bytes) -> tuple[CallResult, Judgement]:
    """Send one saved payload to one RPC (``Retriever.Ingest``) of a fresh server, and judge the reply."""
    rpc = next((r for r in discover() if r.name == rpc_name), None)
    if rpc is None:
        raise ValueError(f"no RPC {rpc_name!r}; there are {', '.join(r.name for r in discover())}")
    options.workdir.mkdir(parents=True, exist_ok=True)
    with ServerProcess(options.workdir, options.server_args) as server:
        result = invoke(server.channel(rpc.service), rpc, payload, options.deadline_s, server.metadata)
        judgement = judge(rpc, result, options.deadline_s, options.margin_s)
        if not server.alive():
            judgement = Judgement(Verdict.CRASH, f"the server process exited ({server.exit_code()})")
    return result, judgement


def run_fuzz(options: FuzzOptions, progress: Callable[[RpcTally], None] | None = None) -> Report:
    """Fuzz every (selected) RPC over real gRPC against a server process of its own."""
    seed = options.seed if options.seed is not None else random.getrandbits(SEED_BITS)
    report = Report(options, seed)
    start = time.monotonic()
    options.workdir.mkdir(parents=True, exist_ok=True)
    with ServerProcess(options.workdir, options.server_args) as server:
        report.server_logs.append(str(server.log_path))
        for n, rpc in enumerate(selected(discover(), options.only)):
            tally = RpcFuzzer(server, rpc, options, report).run(dictionary(server), seed + n * MAX_ROUNDS)
            report.tallies.append(tally)
            if progress is not None:
                progress(tally)
        assert server.info is not None
        report.probes = [healthy(server), drained(server.info), *normal_requests(server)]
    report.seconds = time.monotonic() - start
    return report
