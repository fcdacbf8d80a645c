"""The grounding check's candidate signals, computed once per question and cached to a JSON (issue 52):
the served answer (plain greedy), its token log-probs, the refusal's log-probs under the same prompt (one
extra forward of its few tokens on the prompt's KV), the prompt's passages with their retrieval scores.
``answer_quality_tune`` then picks the check's rule offline over this file.

    python -m lookahead_rag.bench.answer_quality_signals --corpus C --questions Q --answerable 120 \\
        --unanswerable 60 --k 3 --hybrid off --model qwen2.5-coder-0.5b-instruct --weights file \\
        --threads 2 --json bench/results/quality_signals.json

The sample is spread over the whole file (questions ordered by a hash of their id, not the file's order),
and every question carries its half (``half``: a hash of its paragraph), so a rule tuned on one half is
validated on paragraphs it never saw.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lookahead_core.models import load_model
from tqdm import tqdm
from transformers import DynamicCache

from lookahead_rag.bench.answer_quality_args import SEARCHES
from lookahead_rag.bench.answer_quality_search import search_core
from lookahead_rag.bench.common import add_model_args, placement, read_jsonl, run_header, workload_parser, write_json
from lookahead_rag.bench.dataset import dataset_from_args
from lookahead_rag.bench.prompt_order import ORDERS, retriever_cores
from lookahead_rag.bench.serve_load import SINGLE_TENANT, Question, Workload
from lookahead_rag.bench.squad_eval import abstains, score
from lookahead_rag.services.generator.settings import REFUSAL
from lookahead_rag.services.retriever.documents import Document

HALVES = 2  # the sample's halves: tune on one, validate on the other
DEFAULT_ANSWERABLE = 120
DEFAULT_UNANSWERABLE = 60
DEFAULT_MAX_NEW = 24


def stable_hash(text: str) -> int:
    """A hash of ``text`` that does not change between runs (Python's own is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def half_of(doc_id: str) -> int:
    """The half a question falls in, by its paragraph: a paragraph's questions stay together."""
    return stable_hash(doc_id) % HALVES


def spread(rows: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` of ``rows`` spread over the file: the first ``n`` by a hash of their id."""
    return sorted(rows, key=lambda r: stable_hash(str(r["id"])))[:n]


def sample(questions: Sequence[dict[str, Any]], answerable: int, unanswerable: int) -> list[dict[str, Any]]:
    """The answerable and unanswerable questions sampled (answerable ones first)."""
    yes = [q for q in questions if q.get("answerable", True)]
    no = [q for q in questions if q.get("answerable") is False]
    return [*spread(yes, answerable), *spread(no, unanswerable)]


def scored_greedy(model: Any, prompt: Sequence[int], refusal: Sequence[int], max_new: int,
                  eos: set[int]) -> dict[str, Any]:
    """The greedy answer of ``prompt`` with its tokens' log-probs, and the refusal's log-probs under the
    same prompt (its forward rides on the prompt's KV, cropped back before the answer is decoded)."""
    start = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache()  # the prompt's KV, then the refusal's (cropped off) or the answer's
        out = model(input_ids=torch.tensor([list(prompt)]), cache=cache, use_cache=True, logits_to_keep=1)
        first = out.logits[0, -1].float().log_softmax(-1)  # [vocab]
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        ref = model(input_ids=torch.tensor([list(refusal)]), cache=cache, use_cache=True)
        ref_lp = torch.cat([first[None], ref.logits[0, :-1].float().log_softmax(-1)])  # [refusal, vocab]
        refusal_lps = ref_lp.gather(1, torch.tensor(list(refusal))[:, None])[:, 0].tolist()
        refusal_s = time.perf_counter() - start
        cache.crop(-len(refusal))  # back to the prompt's KV
        tokens: list[int] = []
        lps: list[float] = []
        alt: list[float] = []  # at each answer position: the refusal's next token's log-prob while on its path
        lp = first
        for _ in range(max_new):
            t = int(lp.argmax())
            tokens.append(t)
            lps.append(float(lp[t]))
            i = len(tokens) - 1
            if i < len(refusal) and tokens[:i] == list(refusal[:i]):
                alt.append(float(lp[refusal[i]]))
            if t in eos:
                break
            nxt = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
            lp = nxt.logits[0, -1].float().log_softmax(-1)
    return {"tokens": tokens, "logprobs": lps, "refusal_logprobs": refusal_lps, "refusal_path_logprobs": alt,
            "prefill_s": round(prefill_s, 4), "refusal_s": round(refusal_s, 4)}


def eos_ids(model: Any, tok: Any) -> set[int]:
    ids = model.generation_config.eos_token_id
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    return found | ({tok.eos_token_id} if tok.eos_token_id is not None else set())


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = read_jsonl(args.corpus)
    rows = sample(read_jsonl(args.questions), args.answerable, args.unanswerable)
    wl = Workload({SINGLE_TENANT: [Document(r["id"], r.get("title", ""), r["text"]) for r in corpus]},
                  [Question(str(r["id"]), SINGLE_TENANT, r["question"]) for r in rows])
    model, tok = load_model(args.model, **placement(args))
    refusal = tok.encode(REFUSAL, add_special_tokens=False)
    eos = eos_ids(model, tok)
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-signals-") as root:
        base = retriever_cores(Path(root), args, wl, tok, ORDERS[:1])[ORDERS[0]]
        core = search_core(base, wl, SEARCHES[args.hybrid])
        for r, q in tqdm(list(zip(rows, wl.pool, strict=True)), desc="signals"):
            got = core.retrieve(q.tenant, q.question, k=args.k, max_new_tokens=args.max_new_tokens)
            s = scored_greedy(model, got.prompt_ids, refusal, args.max_new_tokens, eos)
            answer = tok.decode(s["tokens"], skip_special_tokens=True).strip()
            refs = list(r.get("answers") or [])
            out.append({"id": q.qid, "question": q.question, "doc_id": r["doc_id"], "half": half_of(r["doc_id"]),
                        "answerable": bool(r.get("answerable", True)), "answers": refs, "answer": answer,
                        "f1": score(answer, refs).f1 if refs else None, "model_abstains": abstains(answer),
                        "gold_in_prompt": r["doc_id"] in {c.chunk.doc_id for c in got.chunks},
                        "prompt_tokens": len(got.prompt_ids), **s,
                        "passages": [{"doc_id": c.chunk.doc_id, "chunk_id": c.chunk.chunk_id, "title": c.chunk.title,
                                      "text": c.chunk.text, "score": c.score} for c in got.chunks]})
        core.close()
        base.close()
    return {"kind": "quality_signals", **run_header(args), "k": args.k, "hybrid": args.hybrid,
            "max_new_tokens": args.max_new_tokens, "refusal": REFUSAL, "refusal_ids": refusal, "questions": out}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = workload_parser("python -m lookahead_rag.bench.answer_quality_signals", __doc__)
    p.add_argument("--answerable", type=int, default=DEFAULT_ANSWERABLE, help="answerable questions sampled")
    p.add_argument("--unanswerable", type=int, default=DEFAULT_UNANSWERABLE, help="unanswerable questions sampled")
    p.add_argument("--k", type=int, default=3, help="passages retrieved")
    p.add_argument("--hybrid", choices=("off", "on"), default="off", help="FAISS alone (off) or + BM25 (on)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW, help="greedy answer length cap")
    add_model_args(p)
    args = p.parse_args(argv)
    args.dataset = dataset_from_args(p, args).name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    data = run(args)
    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
