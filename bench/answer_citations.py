"""bench quality's citation check (issue 45's target: every answer carries at least one citation whose
passage holds its answer span, when a passage holds one). Pure functions over text; the citations are
the product's own (``services/retriever/citations.cite``), as the generator attaches them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookahead_rag.bench.squad_eval import abstains, normalize_answer
from lookahead_rag.services.retriever.citations import CitedPassage, cite

PERCENT = 100.0
DIGITS = 1


def answer_span(answer: str, refs: Sequence[str], passages: Sequence[CitedPassage]) -> str | None:
    """The answer's span in the passages (normalized): the whole answer when a passage holds it, else a
    reference answer the answer contains and a passage holds; None when no passage holds either."""
    said = normalize_answer(answer)
    texts = [normalize_answer(p.text) for p in passages]
    inside = [n for n in (normalize_answer(r) for r in refs) if n and n in said]
    return next((c for c in (said, *inside) if c and any(c in t for t in texts)), None)


def cites_span(answer: str, span: str, passages: Sequence[CitedPassage]) -> bool:
    """Whether one of the answer's citations names a passage that holds ``span``."""
    cited = {c.chunk_id for c in cite(answer, passages)}
    return any(p.chunk_id in cited and span in normalize_answer(p.text) for p in passages)


def citation_row(answers: Sequence[str], refs: Sequence[Sequence[str]],
                 prompts: Sequence[Sequence[CitedPassage]]) -> dict[str, Any]:
    """Of the answers with a span in their prompt's passages, the share cited to a passage holding it
    (``cited_pct``, over ``answers_with_span``); of the answers that do not abstain, the share with any
    citation (``any_citation_pct``)."""
    spans = [(a, answer_span(a, r, p), p) for a, r, p in zip(answers, refs, prompts, strict=True)]
    with_span = [(a, s, p) for a, s, p in spans if s is not None]
    ok = sum(cites_span(a, s, p) for a, s, p in with_span)
    spoken = [(a, p) for a, p in zip(answers, prompts, strict=True) if not abstains(a)]
    any_cited = sum(bool(cite(a, p)) for a, p in spoken)
    return {"cited_pct": _pct(ok, len(with_span)), "answers_with_span": len(with_span),
            "any_citation_pct": _pct(any_cited, len(spoken))}


def _pct(n: int, d: int) -> float | None:
    return round(n / d * PERCENT, DIGITS) if d else None
