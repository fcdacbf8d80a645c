"""The answer-quality benchmark (what it measures and its command line: bench/answer_quality_args.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lookahead_core import DecodingConfig, TokenTrie
from lookahead_core.models import load_model, load_tokenizer
from tqdm import tqdm

from lookahead_rag.bench.answer_citations import abstain_row, citation_row
from lookahead_rag.bench.answer_quality_search import (
    compare_searches,
    pct,
    search_core,
    search_name,
    search_names,
    with_distractors,
)
from lookahead_rag.bench.common import placement, print_table, ran_on, read_jsonl, run_header
from lookahead_rag.bench.engine_runner import SchedulerRunner
from lookahead_rag.bench.plot import write_outputs
from lookahead_rag.bench.prompt_order import ORDERS, retriever_cores, unanswerable_pool
from lookahead_rag.bench.serve_hf import greedy
from lookahead_rag.bench.serve_load import Question, Workload, load_workload
from lookahead_rag.bench.squad_eval import abstains, quality_row, score
from lookahead_rag.services.generator.grounding import documents_of
from lookahead_rag.services.retriever.citations import CitedPassage, cite
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.prompt import Passage, build_prompt
from lookahead_rag.v1 import events_pb2

# past answers: every one in the prompt (as before issue 45: none filtered out), in the prompt where their
# passages support them ([retriever] past_answers_in_prompt), as drafts only (the default), not at all
PAST_SETTINGS = ("prompt_all", "prompt", "drafts", "none")
PAST_MODE = "hierarchical"


class Answerer:
    """Plain greedy answers of prompts, each distinct prompt answered once."""

    def __init__(self, model: Any, tok: Any, max_new: int) -> None:
        self.model, self.tok, self.max_new = model, tok, max_new
        self.done: dict[tuple[int, ...], str] = {}

    def __call__(self, ids: Sequence[int]) -> str:
        key = tuple(ids)
        if key not in self.done:
            self.done[key] = self.tok.decode(greedy(self.model, key, self.max_new), skip_special_tokens=True).strip()
        return self.done[key]


def gold_ids(core: RetrieverCore, tok: Any, q: Question, doc: dict[str, Any], max_new: int) -> list[int]:
    """The prompt the retriever would build with the question's own paragraph as its one passage."""
    s = core.settings
    passage = Passage(doc.get("title", ""), doc["text"], 1.0, doc["id"], 0)
    return build_prompt(tok, q.question, [passage], [], core.prompt_budget(max_new), s.system_prompt,
                        s.min_truncated_tokens).ids


def answer_row(answers: Sequence[str], refs: Sequence[list[str]]) -> dict[str, Any]:
    """EM / F1 of answers to answerable questions, and how many wrongly abstained."""
    row = quality_row([score(a, r) for a, r in zip(answers, refs, strict=True)])
    return {**row, "wrongly_abstained_pct": pct(sum(abstains(a) for a in answers), len(answers))}


def served(core: RetrieverCore, answer: Answerer, pool: Sequence[Question], unanswerable: Sequence[Question],
           gold: dict[str, str], refs: dict[str, list[str]], k: int, max_new: int) -> dict[str, Any]:
    """One served setting (a core's passage order, k): gold paragraph in the prompt, EM / F1, abstention."""
    held, shown, answers, prompts, checked = 0, 0, [], [], []
    search = search_name(core)
    for q in tqdm(pool, desc=f"served {search} {core.settings.passage_order.value} k={k}"):
        r = core.retrieve(q.tenant, q.question, k=k, max_new_tokens=max_new)
        held += gold[q.qid] in {c.chunk.doc_id for c in r.chunks}
        shown += len(r.chunks)
        answers.append(answer(r.prompt_ids))
        prompts.append([CitedPassage(c.chunk.doc_id, c.chunk.chunk_id, c.chunk.text) for c in r.chunks])
        checked.append((answers[-1], documents_of(r.chunks), q.question))
    unchecked = []  # the unanswerable questions' answers, documents and questions, as the generator checks them
    for q in unanswerable:
        r = core.retrieve(q.tenant, q.question, k=k, max_new_tokens=max_new)
        unchecked.append((answer(r.prompt_ids), documents_of(r.chunks), q.question))
    said = [abstains(a) for a, _, _ in unchecked]
    core.close()
    return {"search": search, "order": core.settings.passage_order.value, "k": k,
            "min_score_ratio": core.settings.passage_min_score_ratio, "passages": round(shown / max(len(pool), 1), 2),
            "gold_in_prompt_pct": pct(held, len(pool)),
            **answer_row(answers, [refs[q.qid] for q in pool]),
            **citation_row(answers, [refs[q.qid] for q in pool], prompts, [q.question for q in pool]),
            "abstained_pct": pct(sum(said), len(said)), "answered_anyway_pct": pct(len(said) - sum(said), len(said)),
            **abstain_row(checked, unchecked),
            "answers": answers}


def feed_back(core: RetrieverCore, q: Question, text: str, chunks: Sequence[Any], every: bool) -> None:
    """The finished answer as the product feeds it back: a GenerationCompleted with its citations
    (``every``: one made up where none was found, so every answer may be shown, as before issue 45)."""
    event = events_pb2.GenerationCompleted(event_id=uuid.uuid4().hex, tenant=q.tenant, question=q.question,
                                           answer_text=text, doc_ids=sorted({c.chunk.doc_id for c in chunks}))
    for c in cite(text, [CitedPassage(c.chunk.doc_id, c.chunk.chunk_id, c.chunk.text) for c in chunks]):
        event.citations.add(doc_id=c.doc_id, chunk_id=c.chunk_id, start=c.start, end=c.end, quote=c.quote)
    if every and not event.citations:
        event.citations.add(doc_id="", chunk_id="", start=0, end=0, quote="")
    core.sessions.apply(event)


def past_study(base: RetrieverCore, wl: Workload, model: Any, tok: Any, pool: Sequence[Question],
               refs: dict[str, list[str]], rounds: int, max_new: int) -> dict[str, Any]:
    """Past answers in the prompt / as drafts only / not at all, over ``rounds`` passes of ``pool``."""
    cfg = DecodingConfig(max_new_tokens=max_new, mode=PAST_MODE)
    out: dict[str, Any] = {}
    for setting in PAST_SETTINGS:
        core = RetrieverCore(base.settings.model_copy(update={"past_answers_in_prompt": setting.startswith("prompt")}),
                             embedder=base.embedder, tokenizer=tok, limits=base.limits, served=base.served)
        for tenant, docs in wl.docs.items():
            core.ingest(tenant, docs)
        runner = SchedulerRunner(model, tok, cfg, TokenTrie(cfg.trie) if setting != "none" else None)
        answers, tokens, steps, wall, past_shown = [], 0, 0, 0.0, 0
        for _ in range(rounds):
            for q in tqdm(pool, desc=f"past answers: {setting}"):
                r = core.retrieve(q.tenant, q.question, m=2, max_new_tokens=max_new)
                past_shown += bool(r.sessions)
                start = time.perf_counter()
                ids, n_steps, _ = runner(r.prompt_ids)
                wall += time.perf_counter() - start
                text = tok.decode(ids, skip_special_tokens=True).strip()
                tokens, steps = tokens + len(ids), steps + n_steps
                answers.append(text)
                feed_back(core, q, text, r.chunks, every=setting == "prompt_all")
        runner.close()
        core.close()
        out[setting] = {**answer_row(answers, [refs[q.qid] for _ in range(rounds) for q in pool]),
                        "tokens": tokens, "tokens_per_step": round(tokens / max(steps, 1), 2),
                        "tokens_per_s": round(tokens / max(wall, 1e-9), 2), "prompts_with_past_answers": past_shown,
                        "answers": answers}
    out["drafts_equal_none"] = out["drafts"]["answers"] == out["none"]["answers"]  # lossless drafting
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    wl = load_workload(args.corpus, args.questions, args.limit, args.tenants_by_title)
    if args.distractors:
        wl = with_distractors(wl, read_jsonl(args.distractors))
    unanswerable = unanswerable_pool(args, wl)
    rows = {str(q.get("id")): q for q in read_jsonl(args.questions)}
    corpus = {r["id"]: r for r in read_jsonl(args.corpus)}
    gold = {q.qid: rows[q.qid]["doc_id"] for q in wl.pool}
    refs = {q.qid: list(rows[q.qid].get("answers") or []) for q in wl.pool}
    model, tok = (None, load_tokenizer(args.model)) if args.recall_only else load_model(args.model, **placement(args))
    answer = Answerer(model, tok, args.max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as root:
        orders = tuple(o for o in ORDERS if o.value in args.orders)
        cores = retriever_cores(Path(root), args, wl, tok,  # canonical always: the retrieval figures' core
                                ORDERS[:1] if args.recall_only else tuple(dict.fromkeys((ORDERS[0], *orders))))
        canonical = cores[ORDERS[0]]
        ks = args.ks or [canonical.limits.resolve_k(0)]
        searches, passages = compare_searches(canonical, wl, search_names(args.hybrid, canonical.settings.hybrid),
                                              gold, ks, args.max_new_tokens, args.min_score_ratio)
        retrieval = next(iter(searches.values()))
        answers = not args.recall_only
        gold_answers = [answer(gold_ids(canonical, tok, q, corpus[gold[q.qid]], args.max_new_tokens))
                        for q in tqdm(wl.pool if answers else [], desc="gold paragraph")]
        names = search_names(args.hybrid, canonical.settings.hybrid)
        ratios = [0.0, *[r for r in args.min_score_ratio if r]]  # fixed k, then each adaptive-k ratio
        settings = [served(search_core(cores[order], wl, name, ratio), answer, wl.pool, unanswerable, gold, refs,
                           k, args.max_new_tokens)
                    for name in (names if answers else []) for k in ks for ratio in ratios for order in orders]
        past = (past_study(canonical, wl, model, tok, wl.pool[: args.past], refs, args.past_rounds,
                           args.max_new_tokens) if args.past and answers else None)
        system_prompt = canonical.settings.system_prompt
        indexed_chunks = canonical.stats().chunks
        for core in cores.values():
            core.close()
    return {
        "kind": "answer_quality", **run_header(args), "weights": getattr(args, "weights", None),  # --weights
        "questions": len(wl.pool), "unanswerable_questions": len(unanswerable), "tenants": len(wl.docs),
        "max_new_tokens": args.max_new_tokens, "system_prompt": system_prompt, "retrieval": retrieval,
        "retrieval_by_search": searches, "passages_by_search": passages, "indexed_chunks": indexed_chunks,
        "distractors": args.distractors or None,
        "gold": ({**answer_row(gold_answers, [refs[q.qid] for q in wl.pool]), "answers": gold_answers}
                 if answers else None),
        "served": settings, "past": past,
        "ids": [q.qid for q in wl.pool],
    }


COLUMNS = [("setting", "setting", "s"), ("gold_in_prompt_pct", "gold in prompt %", ".1f"),
           ("squad_em", "EM %", ".1f"), ("squad_f1", "F1 %", ".1f"), ("wrongly_abstained_pct", "abstained (ans.) %",
                                                                     ".1f"),
           ("abstained_pct", "abstained (unans.) %", ".1f"),
           ("checked_abstained_pct", "abstain check: unans. %", ".1f"),
           ("checked_wrongly_abstained_pct", "abstain check: ans. %", ".1f"), ("cited_pct", "cited %", ".1f"),
           ("passages", "passages", ".2f"),
           ("tokens_per_step", "tok/step", ".2f"), ("tokens_per_s", "tok/s", ".2f")]


def served_name(row: dict[str, Any]) -> str:
    """A served setting as the table names it: search, passage order, k (and the adaptive-k ratio)."""
    ratio = row.get("min_score_ratio")
    return " ".join(p for p in ("served", row.get("search"), row["order"], f"k={row['k']}",
                                f"r={ratio:g}" if ratio else "") if p)


def table_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"setting": "gold paragraph", **data["gold"]}] if data.get("gold") else []
    rows += [{"setting": served_name(s), **s} for s in data["served"]]
    for name in PAST_SETTINGS:
        if data.get("past"):
            rows.append({"setting": f"past answers: {name}", **data["past"][name]})
    return rows


def report(args: argparse.Namespace) -> int:
    """Run, print the table, and write the JSON and its PNG when asked."""
    data = run(args)
    print()
    for name, found in data["retrieval_by_search"].items():
        print(f"{name}: " + ", ".join(f"{k} {v}%" for k, v in found.items()))
        shown = data["passages_by_search"][name]
        print(f"{name}: passages per prompt " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    print_table([{c: r.get(c) for c, _, _ in COLUMNS} for r in table_rows(data)], COLUMNS)
    print(f"{ran_on(data)}, {data['questions']} answerable + {data['unanswerable_questions']} unanswerable "
          f"questions, {data['max_new_tokens']} new tokens, {data['indexed_chunks']} chunks indexed")
    write_outputs(data, args.json, args.png)
    return 0


if __name__ == "__main__":
    from lookahead_rag.bench.answer_quality_args import main

    raise SystemExit(main(sys.argv[1:]))
