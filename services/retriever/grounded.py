"""Whether the passages support an answer: the check the generator applies to every answer (``[generator]
ungrounded``) and ``bench quality`` applies to its answers, so the bench's abstention is the product's.

Pure text, no model call, built from the citation matcher (``citations.Matcher``): an answer is grounded
when the sentences a passage supports (a span of it holding their content words) carry at least
``MIN_SUPPORTED_SHARE`` of the answer's content weight, and at least ``MIN_NEW_WORDS_FOUND`` of the
content words it adds to the question occur in the passages at all (an answer that only echoes the
question's words is judged by its sentences alone). The refusal itself ("The documents do not say.")
claims nothing and counts as grounded; an empty answer, or one with no passages, does not.

    ground("Rollo was the first ruler.", passages, "Who was the first ruler of Normandy?", refusal)
    -> Grounding(citations=(Citation(...),), grounded=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lookahead_rag.services.retriever.citations import Citation, CitedPassage, Matcher, citations
from lookahead_rag.services.retriever.content_words import FUNCTION_WORDS
from lookahead_rag.services.retriever.word_match import words

MIN_SUPPORTED_SHARE = 0.5  # of the answer's content weight, in sentences a passage supports
MIN_NEW_WORDS_FOUND = 0.5  # of the content words the answer adds to the question, found in the passages


@dataclass(frozen=True, slots=True)
class Grounding:
    citations: tuple[Citation, ...]  # the passages supporting the answer (citations.cite)
    grounded: bool  # whether they support it (or it is the refusal)


def _said(text: str) -> list[str]:
    return [w for w, _, _ in words(text)]


def is_refusal(answer: str, refusal: str) -> bool:
    """Whether ``answer`` is ``refusal`` (case, spacing and punctuation aside), perhaps followed by more."""
    said, refused = _said(answer), _said(refusal)
    return bool(refused) and said[:len(refused)] == refused


def new_words_found(answer: str, matcher: Matcher) -> float | None:
    """The share of the content words ``answer`` adds to the question that occur in the passages (None:
    it adds none)."""
    new = {w for w in _said(answer) if w not in FUNCTION_WORDS} - matcher.question
    if not new:
        return None
    held = set().union(*(index.at.keys() for index in matcher.indexes)) if matcher.indexes else set()
    return len(new & held) / len(new)


def ground(answer: str, passages: Sequence[CitedPassage], question: str = "", refusal: str = "") -> Grounding:
    """``answer``'s citations and whether ``passages`` support it (to ``question``, when known)."""
    matcher = Matcher(passages, question)
    supported = matcher.answer(answer)
    cited = tuple(citations(supported))
    if is_refusal(answer, refusal):
        return Grounding(cited, True)
    total = sum(s.weight for s in supported)
    held = sum(s.weight for s in supported if s.support is not None)
    found = new_words_found(answer, matcher)
    grounded = total > 0 and held >= MIN_SUPPORTED_SHARE * total and (found is None or found >= MIN_NEW_WORDS_FOUND)
    return Grounding(cited, grounded)
