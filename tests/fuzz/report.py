"""The fuzz report: JSON (everything) and a short text table (per RPC: cases, time per 1,000 cases,
status codes, verdicts, bad-input classes tried and refused; then the probes and the failures)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from tests.fuzz.driver import Report
from tests.fuzz.outcome import FAILURES, RpcTally, Verdict

SHOWN_FAILURES = 10  # failures listed in the text table (the JSON keeps more)
NAME_WIDTH = 24


def class_summary(tallies: list[RpcTally]) -> dict[str, dict[str, int]]:
    """Per bad-input class over all RPCs: cases that carried it, how many were refused, failed, ok."""
    out: dict[str, Counter[str]] = {}
    for tally in tallies:
        for name, counts in tally.classes.items():
            merged = out.setdefault(name, Counter())
            merged.update(counts)
            merged["rpcs"] += 1
    return {name: dict(c) for name, c in sorted(out.items())}


def _refused(counts: dict[str, int]) -> int:
    return counts.get(Verdict.REFUSED.value, 0)


def to_json(report: Report) -> dict[str, Any]:
    classes = class_summary(report.tallies)
    verdicts: Counter[str] = Counter()
    for tally in report.tallies:
        verdicts.update(tally.verdicts)
    options = {k: (str(v) if k == "workdir" else v) for k, v in dataclasses.asdict(report.options).items()}
    return {
        "summary": {
            "rpcs": len(report.tallies),
            "cases": sum(t.cases for t in report.tallies),
            "min_cases_per_rpc": min((t.cases for t in report.tallies), default=0),
            "verdicts": dict(verdicts.most_common()),
            "crashes": verdicts[Verdict.CRASH.value], "hangs": verdicts[Verdict.HANG.value],
            "errors": verdicts[Verdict.ERROR.value], "slow": verdicts[Verdict.SLOW.value],
            "failed": report.failed,
            "bad_input_classes_tried": len(classes),
            "bad_input_classes_refused": sum(1 for c in classes.values() if _refused(c)),
            "server_restarts": report.restarts,
            "seconds": round(report.seconds, 1),
        },
        "seed": report.seed,
        "options": options,
        "probes": [dataclasses.asdict(p) for p in report.probes],
        "events": report.events,
        "server_logs": report.server_logs,
        "rpcs": [t.to_json() for t in report.tallies],
        "bad_input_classes": classes,
    }


def table_row(t: RpcTally) -> str:
    v = t.verdicts
    refused = sum(1 for c in t.classes.values() if c[Verdict.REFUSED.value])
    cells = [t.cases, f"{t.seconds_per_1000:.1f}", v["ok"], v["refused"], v["slow"], v["error"] + v["bad-response"],
             v["hang"], v["crash"], f"{len(t.classes)}/{refused}"]
    return f"{t.rpc:<{NAME_WIDTH}}" + "".join(f"{c!s:>9}" for c in cells)


def text_table(report: Report) -> str:
    head = ["cases", "s/1000", "ok", "refused", "slow", "error", "hang", "crash", "classes"]
    lines = [f"{'RPC':<{NAME_WIDTH}}" + "".join(f"{h:>9}" for h in head)]
    for t in report.tallies:
        lines.append(table_row(t))
        lines.append("    codes: " + ", ".join(f"{code}={n}" for code, n in t.codes.most_common()))
    summary = to_json(report)["summary"]
    lines.append(f"total: {summary['cases']} cases over {summary['rpcs']} RPCs in {summary['seconds']} s; "
                 f"crashes {summary['crashes']}, hangs {summary['hangs']}, errors {summary['errors']}, "
                 f"slow {summary['slow']}; bad-input classes tried {summary['bad_input_classes_tried']}, "
                 f"refused {summary['bad_input_classes_refused']}; server restarts {report.restarts}; "
                 f"seed {report.seed}")
    lines.append("probes: " + ", ".join(f"{p.name} {'ok' if p.ok else 'FAILED: ' + p.detail}" for p in report.probes))
    failures = [f for t in report.tallies for f in t.failures if f.verdict in {v.value for v in FAILURES}]
    for f in failures[:SHOWN_FAILURES]:
        lines.append(f"FAIL {f.rpc} {f.verdict} {f.code}: {f.reason[:200]} [{', '.join(f.classes[:6])}]")
    lines.extend(f"event: {e}" for e in report.events)
    return "\n".join(lines)
