"""``lookahead-rag-bench replica-requests``: a requests file for ``serve --replay`` made without serving.

    lookahead-rag-bench replica-requests [--corpus C.jsonl --questions Q.jsonl] --requests 32 --pool 44 \\
        --zipf 1.1 --seed 0 --out results/replicas_requests.json

The same Zipf-popular sequence as ``serve`` draws (bench/serve_load.py), each question grounded on its
own document in the chat template (``bench.common.grounded_prompt_ids``: tokenizer only, no model, no
retriever), written in the ``--record`` file format as level 1, way ``on``. ``serve --replicas`` replays
it through the proxy; recording the prompts with ``serve --record`` instead costs a whole serving run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lookahead_rag.bench.common import add_draw_args, grounded_prompt_ids, read_jsonl, workload_parser, write_json
from lookahead_rag.bench.dataset import dataset_from_args
from lookahead_rag.bench.serve_load import SINGLE_TENANT, draw_sequence, load_workload
from lookahead_rag.bench.serve_record import DEFAULT_WAY, FORMAT, KIND, sequence_json


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("lookahead-rag-bench replica-requests", __doc__)
    add_draw_args(p, 32, "requests in the sequence")
    p.add_argument("--model", default="smollm2-135m-instruct", help="whose tokenizer makes the prompt ids")
    p.add_argument("--out", required=True, help="the requests file to write")
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    return args


def build(args: argparse.Namespace) -> dict[str, Any]:
    from lookahead_core.models import load_tokenizer  # transformers: only once the arguments are parsed

    wl = load_workload(args.corpus, args.questions, args.pool, by_title=False)
    drawn = draw_sequence(len(wl.pool), args.requests, args.zipf, args.seed)
    docs = {r["id"]: r for r in read_jsonl(args.corpus)}
    doc_of = {str(q.get("id", i)): q.get("doc_id", "") for i, q in enumerate(read_jsonl(args.questions))}
    tokenizer = load_tokenizer(args.model)
    requests = []
    for i, p in enumerate(drawn):
        q = wl.pool[p]
        doc = docs.get(doc_of.get(q.qid, ""))
        ids = grounded_prompt_ids(tokenizer, [doc] if doc else [], q.question)
        requests.append({"index": i, "client": 0, "client_order": i, "completed": True, "error": None,
                         "prompt_ids": ids})
    return {"kind": KIND, "format": FORMAT, "source": "replica-requests (grounded on each question's document)",
            "exact": False, "complete": True, "sequence": sequence_json(wl, drawn),
            "bench_args": {"model": args.model, "requests": args.requests, "zipf": args.zipf, "pool": args.pool,
                           "seed": args.seed, "tenant": SINGLE_TENANT},
            "levels": {"1": {DEFAULT_WAY: {"wall_s": 0.0, "requests": requests}}}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data = build(args)
    write_json(args.out, data)
    distinct = len({tuple(r["prompt_ids"]) for r in data["levels"]["1"][DEFAULT_WAY]["requests"]})
    print(f"wrote {args.out}: {args.requests} requests, {distinct} distinct prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
