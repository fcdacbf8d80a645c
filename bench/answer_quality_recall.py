"""Retrieval defaults on the numbers (issue 52, item 5): for every question of the file, answerable or
not, whether the served prompt holds the question's own paragraph, for each search (dense, hybrid) and k.
Retrieval only: no model forward (the tokenizer builds the prompts), so all of squad-dev runs in minutes.

    python -m lookahead_rag.bench.answer_quality_recall --corpus C --questions Q --ks 1,2,3,4,5,8 \\
        --model qwen2.5-coder-0.5b-instruct --json bench/results/quality_recall_squad.json

The PNG (--png, default next to --json) is bench quality's retrieval panel (``answer_quality_plot``, as
``quality --recall-only`` draws it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from lookahead_core.models import load_tokenizer

from lookahead_rag.bench.answer_quality_args import SEARCHES
from lookahead_rag.bench.answer_quality_plot import plot
from lookahead_rag.bench.answer_quality_search import compare_searches
from lookahead_rag.bench.common import add_model_args, read_jsonl, run_header, workload_parser, write_json
from lookahead_rag.bench.dataset import dataset_from_args
from lookahead_rag.bench.plot import default_png
from lookahead_rag.bench.prompt_order import ORDERS, retriever_cores
from lookahead_rag.bench.serve_load import SINGLE_TENANT, Question, Workload
from lookahead_rag.services.retriever.documents import Document

DEFAULT_KS = "1,2,3,4,5,8"
MAX_NEW = 24  # the answer's room the prompt budget keeps (as bench quality's runs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = read_jsonl(args.corpus)
    rows = read_jsonl(args.questions)
    wl = Workload({SINGLE_TENANT: [Document(r["id"], r.get("title", ""), r["text"]) for r in corpus]},
                  [Question(str(r["id"]), SINGLE_TENANT, r["question"]) for r in rows])
    gold = {str(r["id"]): r["doc_id"] for r in rows}
    tok = load_tokenizer(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-recall-") as root:
        base = retriever_cores(Path(root), args, wl, tok, ORDERS[:1])[ORDERS[0]]
        found, passages = compare_searches(base, wl, list(SEARCHES.values()), gold, args.ks, MAX_NEW)
        chunks = base.stats().chunks
        base.close()
    return {"kind": "quality_recall", **run_header(args), "questions": len(rows),
            "answerable": sum(bool(r.get("answerable", True)) for r in rows), "tenants": len(wl.docs),
            "indexed_chunks": chunks, "retrieval_by_search": found, "passages_by_search": passages}


def main(argv: list[str] | None = None) -> int:
    p = workload_parser("python -m lookahead_rag.bench.answer_quality_recall", __doc__)
    p.add_argument("--ks", default=DEFAULT_KS, help="passages retrieved, comma-separated")
    add_model_args(p)
    args = p.parse_args(argv if argv is not None else sys.argv[1:])
    args.ks = [int(k) for k in args.ks.split(",") if k.strip()]
    args.max_new_tokens = MAX_NEW  # the retriever's prompt budget reads it
    args.dataset = dataset_from_args(p, args).name
    data = run(args)
    for name, held in data["retrieval_by_search"].items():
        print(f"{name}: " + ", ".join(f"{k} {v}%" for k, v in held.items()))
    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    if args.png or args.json:
        png = args.png or str(default_png(args.json))
        plot(data, png)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
