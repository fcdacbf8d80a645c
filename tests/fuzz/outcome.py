"""Judging one fuzz call, and counting them per RPC.

A call is OK (every response parses as the RPC's output type), REFUSED (a proper status with a
one-line message: the caller's fault or a limit), SLOW (DEADLINE_EXCEEDED on our own deadline: a
legitimately long call, reported, not a failure), or a failure: ERROR (UNKNOWN or INTERNAL, i.e. an
unhandled exception, or any other improper status or a multi-line message), BAD_RESPONSE (a reply
that does not parse), HANG (no answer within the deadline plus a margin, or the server stopped
answering health checks) or CRASH (the server process died).
"""

from __future__ import annotations

import base64
import enum
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from tests.fuzz.cases import Case
from tests.fuzz.targets import CallResult, Rpc

PROPER_REFUSALS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
})
MAX_DETAILS_CHARS = 1000  # a longer status message is a dump, not a message
MAX_KEPT_FAILURES = 20  # failing cases kept per RPC (all are counted)
TOP_REFUSALS = 12  # refusal messages listed per RPC
GIST_CHARS = 80
INLINE_PAYLOAD_BYTES = 4096  # a failing payload up to this size goes into the JSON itself


class Verdict(enum.StrEnum):
    OK = "ok"
    REFUSED = "refused"
    SLOW = "slow"
    ERROR = "error"
    BAD_RESPONSE = "bad-response"
    HANG = "hang"
    CRASH = "crash"


FAILURES = frozenset({Verdict.ERROR, Verdict.BAD_RESPONSE, Verdict.HANG, Verdict.CRASH})


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str = ""


def _gist(details: str) -> str:
    """A refusal message without its particulars (numbers, quoted values), so alike ones count together."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", details))[:GIST_CHARS]


def _bad_message(details: str) -> bool:
    return not details.strip() or "\n" in details or len(details) > MAX_DETAILS_CHARS or "Traceback" in details


def judge(rpc: Rpc, result: CallResult, deadline_s: float, margin_s: float) -> Judgement:
    """The verdict on one call (CRASH is the driver's: it alone sees the server process)."""
    code = result.code
    if result.elapsed_s > deadline_s + margin_s:
        return Judgement(Verdict.HANG, f"answered after {result.elapsed_s:.1f} s; the deadline was {deadline_s:.1f} s")
    if code is grpc.StatusCode.OK:
        output = GetMessageClass(rpc.output)
        for n, raw in enumerate(result.responses):
            try:
                output.FromString(raw)
            except DecodeError as exc:
                return Judgement(Verdict.BAD_RESPONSE, f"response {n} does not parse as {rpc.output.name}: {exc}")
        return Judgement(Verdict.OK)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Judgement(Verdict.SLOW, result.details)
    if code in PROPER_REFUSALS:
        if _bad_message(result.details):
            return Judgement(Verdict.ERROR, f"{code.name} with a status message that is not one line: "
                                            f"{result.details[:200]!r}")
        return Judgement(Verdict.REFUSED)
    return Judgement(Verdict.ERROR, f"{code.name}: {result.details[:MAX_DETAILS_CHARS]}")


@dataclass
class Failure:
    """One failing case, kept for the report (and for replaying it)."""

    rpc: str
    verdict: str
    code: str
    reason: str
    classes: list[str]
    origin: str
    payload_bytes: int
    payload_b64: str = ""  # the payload, when small
    payload_file: str = ""  # else where it was written


@dataclass
class RpcTally:
    """Everything counted for one RPC."""

    rpc: str
    service: str
    cases: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    codes: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)
    classes: dict[str, Counter[str]] = field(default_factory=dict)  # class -> {"tried", "refused", "ok", ...}
    failures: list[Failure] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)  # what stopped the refused cases (messages, shortened)

    def add(self, case: Case, result: CallResult, judgement: Judgement, save_dir: Path | None = None) -> None:
        self.cases += 1
        self.seconds += result.elapsed_s
        self.slowest_s = max(self.slowest_s, result.elapsed_s)
        self.codes[result.code.name] += 1
        self.verdicts[judgement.verdict.value] += 1
        if judgement.verdict is Verdict.REFUSED:
            self.refusals[f"{result.code.name}: {_gist(result.details)}"] += 1
        for name in case.classes:
            counts = self.classes.setdefault(name, Counter())
            counts["tried"] += 1
            counts[judgement.verdict.value] += 1
        if judgement.verdict in FAILURES and len(self.failures) < MAX_KEPT_FAILURES:
            self.failures.append(self._failure(case, result, judgement, save_dir))

    def _failure(self, case: Case, result: CallResult, judgement: Judgement, save_dir: Path | None) -> Failure:
        failure = Failure(self.rpc, judgement.verdict.value, result.code.name, judgement.reason, sorted(case.classes),
                          case.origin, len(case.payload))
        if len(case.payload) <= INLINE_PAYLOAD_BYTES or save_dir is None:
            failure.payload_b64 = base64.b64encode(case.payload[:INLINE_PAYLOAD_BYTES]).decode()
        else:
            save_dir.mkdir(parents=True, exist_ok=True)
            path = save_dir / f"{self.rpc}-{len(self.failures)}.bin"
            path.write_bytes(case.payload)
            failure.payload_file = str(path)
        return failure

    @property
    def failed(self) -> int:
        return sum(self.verdicts[v.value] for v in FAILURES)

    @property
    def seconds_per_1000(self) -> float:
        return 1000.0 * self.seconds / self.cases if self.cases else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "rpc": self.rpc, "service": self.service, "cases": self.cases, "seconds": round(self.seconds, 3),
            "seconds_per_1000_cases": round(self.seconds_per_1000, 2), "slowest_call_s": round(self.slowest_s, 3),
            "status_codes": dict(self.codes.most_common()), "verdicts": dict(self.verdicts.most_common()),
            "crashes": self.verdicts[Verdict.CRASH.value], "hangs": self.verdicts[Verdict.HANG.value],
            "errors": self.verdicts[Verdict.ERROR.value], "slow": self.verdicts[Verdict.SLOW.value],
            "bad_input_classes": {name: dict(c) for name, c in sorted(self.classes.items())},
            "top_refusals": dict(self.refusals.most_common(TOP_REFUSALS)),
            "failures": [vars(f) for f in self.failures],
        }
