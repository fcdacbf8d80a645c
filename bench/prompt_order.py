"""The prompt-order benchmark (what it measures and its command line: bench/prompt_order_args.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lookahead_core.models import load_model
from tqdm import tqdm

from lookahead_rag.bench.common import answerable, placement, print_table, ran_on, read_jsonl, run_header
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.prefix_hits import prefix_hits
from lookahead_rag.bench.serve_hf import greedy
from lookahead_rag.bench.serve_load import SINGLE_TENANT, Question, Workload, load_workload
from lookahead_rag.bench.serve_stack import StackConfig, build_vector_cache
from lookahead_rag.bench.squad_eval import Score, abstains, mean_score, score
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.prompt import PassageOrder

ORDERS = tuple(PassageOrder)  # canonical first: the default
STACK_NAME = "prompt-order"  # the settings' folder name under the run's temp root
CONCURRENCY = 1  # one question at a time: the retriever's settings do not depend on it
TIMEOUT_S = 60.0  # the generator's deadlines in the stack settings (unused: no generator runs)
PERCENT = 100.0
DIGITS = 4  # rounding of fractions in the JSON


@dataclass
class OrderRun:
    """One order's prompts, hits and answers, question by question."""

    prompts: list[list[int]] = field(default_factory=list)  # prompt ids, in question order
    hits: list[int] = field(default_factory=list)  # prefix-cache hit tokens of each prompt
    answers: list[str] = field(default_factory=list)  # greedy answer text of each prompt
    scores: list[Score | None] = field(default_factory=list)  # None: the question has no reference answers
    abstained: list[bool] = field(default_factory=list)  # per unanswerable question: the answer says so


def retriever_cores(root: Path, args: argparse.Namespace, wl: Workload, tok: Any,
                    orders: tuple[PassageOrder, ...] = ORDERS) -> dict[PassageOrder, RetrieverCore]:
    """One RetrieverCore per order (``args``: model, max_new_tokens, threads), with bench serve's
    retriever settings, the corpus ingested in each (bench/exactness.py builds its prompts with one)."""
    stack = StackConfig(root=root, model=args.model, max_new_tokens=args.max_new_tokens,
                        max_concurrency=CONCURRENCY, threads=args.threads, timeout_s=TIMEOUT_S)
    chunks = build_vector_cache(stack, wl.docs)  # embedded once, read by both cores
    print(f"corpus embedded once: {chunks} chunks, {len(wl.docs)} tenant(s)")
    settings = stack.settings(STACK_NAME)
    rs = settings.retriever
    embedder = Embedder(rs.embedder_path, batch_size=rs.embed_batch_size)
    cores = {}
    for order in orders:
        update: dict[str, Any] = {"passage_order": order, "data_dir": None}
        if getattr(args, "system_prompt", None) is not None:  # prompt-order's flag; exactness and logprobs have none
            update["system_prompt"] = args.system_prompt
        core = RetrieverCore(rs.model_copy(update=update), embedder=embedder,
                             tokenizer=tok, limits=settings.limits, served=settings.model)
        for tenant, docs in wl.docs.items():
            core.ingest(tenant, docs)
        cores[order] = core
    return cores


def build_prompts(cores: dict[PassageOrder, RetrieverCore], pool: list[Question],
                  max_new: int) -> dict[PassageOrder, OrderRun]:
    """Every question's prompt in each order, and each order's prefix-cache hits over the sequence."""
    runs = {order: OrderRun() for order in cores}
    for q in tqdm(pool, desc="prompts"):
        for order, core in cores.items():
            runs[order].prompts.append(core.retrieve(q.tenant, q.question, max_new_tokens=max_new).prompt_ids)
    for order_run in runs.values():
        order_run.hits = prefix_hits([(q.tenant, ids) for q, ids in zip(pool, order_run.prompts, strict=True)])
    return runs


def answer_all(model: Any, tok: Any, runs: dict[PassageOrder, OrderRun], max_new: int) -> int:
    """Greedy answers of every prompt (once per distinct prompt of a question); returns how many were shared."""
    shared = 0
    count = len(next(iter(runs.values())).prompts)
    for i in tqdm(range(count), desc="greedy answers"):
        done: dict[tuple[int, ...], str] = {}
        for order_run in runs.values():
            key = tuple(order_run.prompts[i])
            if key in done:
                shared += 1
            else:
                done[key] = tok.decode(greedy(model, key, max_new), skip_special_tokens=True).strip()
            order_run.answers.append(done[key])
    return shared


def unanswerable_pool(args: argparse.Namespace, wl: Workload) -> list[Question]:
    """The first ``--unanswerable`` questions the file marks unanswerable, each to the tenant of its article."""
    titles = {r["id"]: r.get("title") or SINGLE_TENANT for r in read_jsonl(args.corpus)}
    rows = [q for q in read_jsonl(args.questions) if q.get("answerable") is False][: args.unanswerable]
    pool = []
    for q in rows:
        tenant = titles.get(q.get("doc_id", ""), SINGLE_TENANT) if args.tenants_by_title else SINGLE_TENANT
        if tenant in wl.docs:
            pool.append(Question(str(q.get("id", len(pool))), tenant, q["question"]))
    return pool


def summarize(run: OrderRun) -> dict[str, Any]:
    """An order's totals: prompt and hit tokens, the hit fraction, SQuAD EM / F1 (percent), abstentions."""
    prompt_tokens = sum(len(p) for p in run.prompts)
    hit_tokens = sum(run.hits)
    scored = [s for s in run.scores if s is not None]
    mean = mean_score(scored)
    n = max(len(run.prompts), 1)
    return {
        "prompts": len(run.prompts), "prompt_tokens": prompt_tokens, "prefix_hit_tokens": hit_tokens,
        "mean_prompt_tokens": round(prompt_tokens / n, 1), "mean_hit_tokens": round(hit_tokens / n, 1),
        "hit_fraction": round(hit_tokens / max(prompt_tokens, 1), DIGITS), "scored": len(scored),
        "exact_match": round(mean.exact_match * PERCENT, 2), "f1": round(mean.f1 * PERCENT, 2),
        "unanswerable": len(run.abstained),
        "abstained_pct": round(sum(run.abstained) / len(run.abstained) * PERCENT, 1) if run.abstained else None,
    }


def question_row(i: int, q: Question, references: list[str], runs: dict[PassageOrder, OrderRun]) -> dict[str, Any]:
    """Question i's record in the JSON: its prompt and hit tokens, answer and score in each order."""
    row: dict[str, Any] = {"id": q.qid, "tenant": q.tenant, "answers": references}
    for order, r in runs.items():
        one: dict[str, Any] = {"prompt_tokens": len(r.prompts[i]), "hit_tokens": r.hits[i], "answer": r.answers[i]}
        s = r.scores[i]
        if s is not None:
            one |= {"em": s.exact_match, "f1": round(s.f1, DIGITS)}
        row[order.value] = one
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    wl = load_workload(args.corpus, args.questions, args.limit, args.tenants_by_title)
    unanswerable = unanswerable_pool(args, wl)
    wl = Workload(wl.docs, [*wl.pool, *unanswerable])
    unanswerable_ids = {q.qid for q in unanswerable}
    references = {str(q.get("id")): list(q.get("answers") or []) for q in answerable(read_jsonl(args.questions))}
    model, tok = load_model(args.model, **placement(args))
    with tempfile.TemporaryDirectory(prefix="bench-prompt-order-") as root:
        cores = retriever_cores(Path(root), args, wl, tok)
        cores_prompt = next(iter(cores.values())).settings.system_prompt
        runs = build_prompts(cores, wl.pool, args.max_new_tokens)
        for core in cores.values():
            core.close()
    shared = answer_all(model, tok, runs, args.max_new_tokens)
    for order_run in runs.values():
        order_run.scores = [score(a, references[q.qid]) if references.get(q.qid) else None
                            for q, a in zip(wl.pool, order_run.answers, strict=True)]
        order_run.abstained = [abstains(a) for q, a in zip(wl.pool, order_run.answers, strict=True)
                               if q.qid in unanswerable_ids]
    orders = {order.value: summarize(r) for order, r in runs.items()}
    canonical, by_score = runs[PassageOrder.CANONICAL], runs[PassageOrder.SCORE]
    per_question = [question_row(i, q, references.get(q.qid, []), runs) for i, q in enumerate(wl.pool)]
    return {
        "kind": "prompt_order",  # what `lookahead-rag-bench plot` draws
        **run_header(args),
        "questions": len(wl.pool) - len(unanswerable), "unanswerable_questions": len(unanswerable),
        "system_prompt": cores_prompt, "tenants": len(wl.docs), "max_new_tokens": args.max_new_tokens,
        "identical_prompts": shared,
        "answers_differ": sum(a != b for a, b in zip(canonical.answers, by_score.answers, strict=True)),
        "orders": orders,
        "per_question": per_question,
    }


COLUMNS = [
    ("order", "passage order", "s"), ("prompts", "prompts", "d"), ("prompt_tokens", "prompt tok", "d"),
    ("prefix_hit_tokens", "hit tok", "d"), ("mean_hit_tokens", "hit/prompt", ".1f"),
    ("hit_fraction", "hit frac", ".3f"), ("scored", "scored", "d"), ("exact_match", "EM %", ".2f"),
    ("f1", "F1 %", ".2f"), ("unanswerable", "unanswerable", "d"), ("abstained_pct", "abstained %", ".1f"),
]


def report(args: argparse.Namespace) -> int:
    """Run, print the table, and write the JSON and its PNG when asked."""
    data = run(args)
    print()
    print_table([{"order": o, **r} for o, r in data["orders"].items()], COLUMNS)
    print(f"{ran_on(data)}, {data['questions']} questions, {data['tenants']} tenant(s), {data['max_new_tokens']} "
          f"new tokens; {data['identical_prompts']} prompt(s) identical in both orders, {data['answers_differ']} "
          f"answer(s) differ")
    write_outputs(data, args.json, args.png)
    return 0


if __name__ == "__main__":
    from lookahead_rag.bench.prompt_order_args import main

    raise SystemExit(main(sys.argv[1:]))
