"""Fuzz every RPC of the three services and write a report (``make fuzz``).

    python -m tests.fuzz.run --cases 10000 --report fuzz-report.json [--auth]

Writes the JSON report and the text table beside it (``fuzz-report.txt``), prints the table, and
exits 1 when anything failed (a crash, a hang, an UNKNOWN/INTERNAL or other improper status, a
reply that does not parse, or a probe afterwards). Failing payloads larger than 4 KB are written
under ``--workdir``/failures (smaller ones are in the JSON, base64); the servers' logs are there
too. ``--replay FILE --only Retriever.Ingest`` sends one saved payload again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.fuzz.driver import (
    DEFAULT_DEADLINE_S,
    DEFAULT_HEALTH_EVERY,
    DEFAULT_MARGIN_S,
    FuzzOptions,
    replay,
    run_fuzz,
)
from tests.fuzz.outcome import FAILURES, RpcTally
from tests.fuzz.report import table_row, text_table, to_json
from tests.fuzz.server import DEFAULT_MAX_DOC_CHARS, DEFAULT_MAX_NEW_TOKENS

DEFAULT_CASES = 10_000


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=DEFAULT_CASES, help="cases per RPC")
    p.add_argument("--report", type=Path, default=Path("fuzz-report.json"), help="JSON report (text: .txt beside it)")
    p.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds per call")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN_S, help="past deadline + margin a call is a hang")
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, written in the report)")
    p.add_argument("--only", default="", help="comma-separated RPC names (or parts: Retrieve,Answer)")
    p.add_argument("--seconds-per-rpc", type=float, default=None, help="time budget per RPC (default: none)")
    p.add_argument("--health-every", type=int, default=DEFAULT_HEALTH_EVERY, help="cases between health checks")
    p.add_argument("--workdir", type=Path, default=None, help="server data, logs, failing payloads (default: temp)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="servers' default answer length")
    p.add_argument("--replay", type=Path, default=None,
                   help="send this saved payload (a failures/*.bin file) to the one RPC named by --only")
    p.add_argument("--auth", action="store_true",
                   help="servers require API keys; cases send the known tenant's key, or a bad credential "
                        "(none, unknown, malformed, another scheme) every few cases (tests.fuzz.credentials)")
    p.add_argument("--max-doc-chars", type=int, default=DEFAULT_MAX_DOC_CHARS, help="the retriever's document limit")
    return p.parse_args(argv)


def _progress(tally: RpcTally) -> None:
    print(table_row(tally), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lookahead-rag-fuzz-"))
    options = FuzzOptions(
        workdir=workdir, cases=args.cases, deadline_s=args.deadline, margin_s=args.margin, seed=args.seed,
        only=tuple(o for o in args.only.split(",") if o), health_every=args.health_every,
        seconds_per_rpc=args.seconds_per_rpc,
        server_args=["--max-new-tokens", str(args.max_new_tokens), "--max-doc-chars", str(args.max_doc_chars),
                     *(["--auth"] if args.auth else [])],
    )
    if args.replay is not None:
        result, judgement = replay(options, args.only, args.replay.read_bytes())
        print(f"{args.only}: {result.code.name} {result.details!r} in {result.elapsed_s:.2f} s -> "
              f"{judgement.verdict.value} {judgement.reason}")
        return 1 if judgement.verdict in FAILURES else 0
    report = run_fuzz(options, progress=_progress)
    table = text_table(report)
    args.report.write_text(json.dumps(to_json(report), indent=2) + "\n")
    args.report.with_suffix(".txt").write_text(table + "\n")
    print(table)
    print(f"report: {args.report} (and {args.report.with_suffix('.txt')}); workdir {workdir}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
