"""A questions file in spread order, so ``quality --limit N --unanswerable M`` (the file's first N answerable
and first M unanswerable questions) measures a sample spread over every article rather than the first
paragraphs (issue 52): answerable and unanswerable questions each ordered by a hash of their id
(``answer_quality_signals.spread``), the ids of ``--exclude`` files (a signals cache the grounding check
was tuned on) moved last, so the first ones are questions the check never saw.

    python -m lookahead_rag.bench.answer_quality_sample --questions Q.jsonl \\
        --exclude bench/results/quality_signals_qwen05.json --out spread.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection, Sequence
from typing import Any

from lookahead_rag.bench.answer_quality_signals import spread
from lookahead_rag.bench.common import read_jsonl


def spread_order(rows: Sequence[dict[str, Any]], exclude: Collection[str] = ()) -> list[dict[str, Any]]:
    """``rows`` answerable first, each kind by a hash of its id, the ``exclude`` ids after the others."""
    out = []
    for answerable in (True, False):
        kind = [r for r in rows if bool(r.get("answerable", True)) is answerable]
        ordered = spread(kind, len(kind))
        out += [r for r in ordered if str(r["id"]) not in exclude] + [r for r in ordered if str(r["id"]) in exclude]
    return out


def excluded_ids(paths: Sequence[str]) -> set[str]:
    """The question ids of signals caches (``answer_quality_signals``' JSON)."""
    ids: set[str] = set()
    for path in paths:
        with open(path) as f:
            ids |= {str(q["id"]) for q in json.load(f)["questions"]}
    return ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lookahead_rag.bench.answer_quality_sample", description=__doc__)
    p.add_argument("--questions", required=True, help="the questions JSONL")
    p.add_argument("--exclude", action="append", default=[], help="a signals JSON whose questions go last")
    p.add_argument("--out", required=True, help="the reordered questions JSONL")
    args = p.parse_args(argv if argv is not None else sys.argv[1:])
    rows = spread_order(read_jsonl(args.questions), excluded_ids(args.exclude))
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} questions to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
