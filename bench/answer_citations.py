"""bench quality's citation check (issue 45's target: every answer carries at least one citation whose
passage holds its answer span, when a passage holds one) and its abstention with the generator's own check
(issue 52: ``[generator] ungrounded = "abstain"``). Pure functions over text; the citations and the check
are the product's own (``services/retriever/citations.cite`` with the question, ``services/generator/verdict``),
as the generator applies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookahead_rag.bench.squad_eval import abstains, normalize_answer
from lookahead_rag.services.generator.domain import DocumentChunk
from lookahead_rag.services.generator.settings import REFUSAL
from lookahead_rag.services.generator.verdict import verdict
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


def cites_span(answer: str, span: str, passages: Sequence[CitedPassage], question: str = "") -> bool:
    """Whether one of the answer's citations (to ``question``, as the generator cites) names a passage that
    holds ``span``."""
    cited = {c.chunk_id for c in cite(answer, passages, question)}
    return any(p.chunk_id in cited and span in normalize_answer(p.text) for p in passages)


def citation_row(answers: Sequence[str], refs: Sequence[Sequence[str]],
                 prompts: Sequence[Sequence[CitedPassage]], questions: Sequence[str] | None = None) -> dict[str, Any]:
    """Of the answers with a span in their prompt's passages, the share cited to a passage holding it
    (``cited_pct``, over ``answers_with_span``); of the answers that do not abstain, the share with any
    citation (``any_citation_pct``)."""
    asked = list(questions) if questions is not None else [""] * len(answers)
    spans = [(a, answer_span(a, r, p), p, q) for a, r, p, q in zip(answers, refs, prompts, asked, strict=True)]
    with_span = [(a, s, p, q) for a, s, p, q in spans if s is not None]
    ok = sum(cites_span(a, s, p, q) for a, s, p, q in with_span)
    spoken = [(a, p, q) for a, p, q in zip(answers, prompts, asked, strict=True) if not abstains(a)]
    any_cited = sum(bool(cite(a, p, q)) for a, p, q in spoken)
    return {"cited_pct": _pct(ok, len(with_span)), "answers_with_span": len(with_span),
            "any_citation_pct": _pct(any_cited, len(spoken))}


def withheld(answer: str, documents: Sequence[DocumentChunk], question: str) -> bool:
    """Whether the served answer is withheld: it says the documents do not hold it (``squad_eval.abstains``),
    or the generator's check retracts it with ``[generator] ungrounded = "abstain"`` (the default refusal)."""
    return abstains(answer) or verdict(answer, documents, question, "abstain", REFUSAL).retracted


def abstain_row(answerable: Sequence[tuple[str, Sequence[DocumentChunk], str]],
                unanswerable: Sequence[tuple[str, Sequence[DocumentChunk], str]]) -> dict[str, Any]:
    """With ``ungrounded = "abstain"``: the share of unanswerable questions withheld (``checked_abstained_pct``)
    and of answerable ones wrongly withheld (``checked_wrongly_abstained_pct``); each item (answer, the
    prompt's documents, question)."""
    return {"checked_abstained_pct": _pct(sum(withheld(*u) for u in unanswerable), len(unanswerable)),
            "checked_wrongly_abstained_pct": _pct(sum(withheld(*a) for a in answerable), len(answerable))}


def _pct(n: int, d: int) -> float | None:
    return round(n / d * PERCENT, DIGITS) if d else None
