"""bench quality's retrieval part: recall@k of the question's own paragraph, and how often the served
prompt holds it, for each search the run compares (dense FAISS alone, hybrid FAISS + BM25: --hybrid),
on the corpus alone or grown with real distractor documents (--distractors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from lookahead_rag.bench.answer_quality_args import SEARCHES
from lookahead_rag.bench.serve_load import Question, Workload
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document

RECALL_AT = (1, 3, 5, 10)
PERCENT = 100.0
DIGITS = 1
DISTRACTOR_PREFIX = "distractor:"  # distractor doc ids never meet the corpus's


def pct(n: int, d: int) -> float | None:
    return round(n / d * PERCENT, DIGITS) if d else None


def search_names(values: Sequence[str], default_hybrid: bool) -> list[str]:
    """--hybrid's values (off, on) as search names; none: the retriever's default."""
    if not values:
        return [SEARCHES["on" if default_hybrid else "off"]]
    return [SEARCHES[v] for v in dict.fromkeys(values)]


def with_distractors(wl: Workload, rows: Sequence[dict[str, Any]]) -> Workload:
    """The workload with every distractor document added to every tenant."""
    extra = [Document(f"{DISTRACTOR_PREFIX}{r['id']}", r.get("title", ""), r["text"]) for r in rows]
    return Workload({tenant: [*docs, *extra] for tenant, docs in wl.docs.items()}, wl.pool)


def search_core(base: RetrieverCore, wl: Workload, name: str, ratio: float = 0.0) -> RetrieverCore:
    """A core as ``base`` with the named search and adaptive-k ratio, the workload ingested (its vectors
    from base's cache)."""
    settings = base.settings.model_copy(update={"hybrid": name == SEARCHES["on"], "passage_min_score_ratio": ratio})
    core = RetrieverCore(settings, embedder=base.embedder, tokenizer=base.tokenizer, limits=base.limits,
                         served=base.served)
    for tenant, docs in wl.docs.items():
        core.ingest(tenant, docs)
    return core


def search_name(core: RetrieverCore) -> str:
    """The name of a core's search in the results: dense or hybrid."""
    return SEARCHES["on" if core.settings.hybrid else "off"]


def recall(core: RetrieverCore, pool: Sequence[Question], gold: dict[str, str]) -> dict[str, float | None]:
    """recall@k of each question's own paragraph in the retriever's search (any chunk of its document)."""
    ranks = []
    for q in tqdm(pool, desc=f"recall ({search_name(core)})"):
        found = [c.chunk.doc_id for c in core.search(q.tenant, q.question, max(RECALL_AT))]  # chunk ranks
        ranks.append(found.index(gold[q.qid]) if gold[q.qid] in found else None)
    return {f"recall@{k}": pct(sum(r is not None and r < k for r in ranks), len(ranks)) for k in RECALL_AT}


def setting_name(what: str, k: int, ratio: float) -> str:
    """``in_prompt@3`` (a fixed k), ``in_prompt@3 r=0.8`` (adaptive: at most k, ``ratio`` of the best)."""
    return f"{what}@{k}" + (f" r={ratio:g}" if ratio else "")


def in_prompt(core: RetrieverCore, pool: Sequence[Question], gold: dict[str, str], ks: Sequence[int],
              max_new: int) -> tuple[dict[str, float | None], dict[str, float]]:
    """At each k: the share of served prompts that hold the question's own paragraph, and the mean
    passages a prompt holds (fewer than k with an adaptive-k ratio)."""
    held_pct: dict[str, float | None] = {}
    passages: dict[str, float] = {}
    ratio = core.settings.passage_min_score_ratio
    for k in ks:
        held, shown = 0, 0
        for q in pool:
            chunks = core.retrieve(q.tenant, q.question, k=k, max_new_tokens=max_new).chunks
            held += gold[q.qid] in {c.chunk.doc_id for c in chunks}
            shown += len(chunks)
        held_pct[setting_name("in_prompt", k, ratio)] = pct(held, len(pool))
        passages[setting_name("passages", k, ratio)] = round(shown / max(len(pool), 1), 2)
    return held_pct, passages


def compare_searches(base: RetrieverCore, wl: Workload, names: Sequence[str], gold: dict[str, str],
                     ks: Sequence[int], max_new: int, ratios: Sequence[float] = ()
                     ) -> tuple[dict[str, dict[str, float | None]], dict[str, dict[str, float]]]:
    """Search name -> recall@k and gold-in-prompt at each k (fixed, then each adaptive-k ratio); and
    search name -> mean passages per prompt in each of those settings."""
    found: dict[str, dict[str, float | None]] = {}
    passages: dict[str, dict[str, float]] = {}
    for name in names:
        found[name], passages[name] = {}, {}
        for n, ratio in enumerate([0.0, *[r for r in ratios if r]]):
            core = search_core(base, wl, name, ratio)
            if n == 0:
                found[name] |= recall(core, wl.pool, gold)
            held, shown = in_prompt(core, wl.pool, gold, ks, max_new)
            found[name] |= held
            passages[name] |= shown
            core.close()
    return found, passages
