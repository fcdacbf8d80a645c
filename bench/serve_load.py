"""bench-serve's workload: the corpus per tenant and a Zipf-popular request sequence fixed by a seed.

The pool is the first ``pool`` answerable questions. A seeded shuffle of the pool gives each
question a popularity rank; rank r (1-based) is drawn with weight 1 / r**s, so a few questions
come back often, as in production. The whole sequence depends only on (pool, requests, s, seed),
and every way and concurrency level replays the same one. With ``--replay`` the sequence is a
recorded run's prompts instead (``ReplayPrompt``: tenant and prompt ids).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from lookahead_rag.bench.common import answerable, read_jsonl
from lookahead_rag.bench.dataset import Source
from lookahead_rag.services.retriever.documents import CHUNK_ID_SEP, Document

SINGLE_TENANT = "bench"  # the tenant of every question without --tenants-by-title


@dataclass(frozen=True)
class Question:
    """One question of the pool, addressed to its tenant."""

    qid: str  # the questions file's id
    tenant: str  # the tenant whose documents answer it
    question: str  # the text sent


@dataclass(frozen=True)
class ReplayPrompt:
    """One recorded request replayed as it was served: its tenant and its prompt's token ids (bench/serve_record.py)."""

    tenant: str  # the tenant that sent it (its drafts and quota)
    prompt_ids: tuple[int, ...]  # the prompt as served, sent with Generator.Generate


@dataclass
class Workload:
    """What the benchmark serves: documents per tenant and the pool of questions."""

    docs: dict[str, list[Document]]  # tenant -> its documents
    pool: list[Question]  # the first --pool answerable questions


def zipf_weights(n: int, s: float) -> list[float]:
    """Weights of ranks 1..n: 1 / r**s (unnormalised)."""
    return [1.0 / r**s for r in range(1, n + 1)]


def draw_sequence(pool_size: int, requests: int, s: float, seed: int) -> list[int]:
    """Pool indices of the ``requests`` requests, in the order they are sent."""
    if pool_size < 1:
        raise ValueError("the pool is empty")
    rng = random.Random(seed)
    by_rank = list(range(pool_size))
    rng.shuffle(by_rank)  # by_rank[r - 1] = the pool index of popularity rank r
    ranks = rng.choices(range(pool_size), weights=zipf_weights(pool_size, s), k=requests)
    return [by_rank[r] for r in ranks]


def _title_of(doc_id: str, corpus: dict[str, dict[str, Any]]) -> str:
    row = corpus.get(doc_id)
    return str(row.get("title") or "") if row else doc_id.split(CHUNK_ID_SEP)[0]


def load_workload(corpus_path: str | Source, questions_path: str | Source, pool: int, by_title: bool) -> Workload:
    """Corpus rows ({id,title,text}) as documents per tenant; the first ``pool`` answerable questions."""
    rows = read_jsonl(corpus_path)
    corpus = {r["id"]: r for r in rows}
    docs: dict[str, list[Document]] = defaultdict(list)
    for r in rows:
        tenant = (r.get("title") or SINGLE_TENANT) if by_title else SINGLE_TENANT
        docs[tenant].append(Document(r["id"], r.get("title", ""), r["text"]))
    questions = []
    for q in answerable(read_jsonl(questions_path))[:pool]:
        tenant = (_title_of(q.get("doc_id", ""), corpus) or SINGLE_TENANT) if by_title else SINGLE_TENANT
        questions.append(Question(str(q.get("id", len(questions))), tenant, q["question"]))
    missing = sorted({q.tenant for q in questions} - set(docs))
    if missing:
        raise SystemExit(f"questions address tenants without documents: {', '.join(missing[:5])}")
    return Workload(dict(docs), questions)
