"""Whether the passages support an answer: the check the generator applies to every answer (``[generator]
ungrounded``) and ``bench quality`` applies to its answers, so the bench's abstention is the product's.

Pure text, no model call, built from the citation matcher (``citations.Matcher``): an answer is grounded
when it adds at least ``MIN_NEW_WORDS`` content words to the question's (one that only restates the
question, "The choice is typically left independent.", claims nothing a passage could hold), the
sentences a passage supports (a span of it holding their content words) carry at least
``MIN_SUPPORTED_SHARE`` of its content weight, and at least ``MIN_NEW_WORDS_FOUND`` of the words it adds
occur in the passages at all. The refusal itself ("The documents do not say.") claims nothing and counts
as grounded; an empty answer, or one with no passages, does not.

The cuts were tuned on squad-dev with the 0.5B's answers (``bench/answer_quality_tune.py``, issue 52): a
restated question is the one signal whose cut, picked on half of the paragraphs, withheld no more answerable
questions on the other half (on later held-out questions it withholds 7.5-11.2% of them, restated questions
all but one: bench/README.md); any support or found cut above 0 withheld more answerable questions (answers
the model got wrong or made up) than unanswerable ones, whose answers SQuAD v2 writes to be found in the
passage. So a made-up answer is marked grounded with no citation: its citations, not ``grounded``, say so.

    ground("Rollo was the first ruler.", passages, "Who was the first ruler of Normandy?", refusal)
    -> Grounding(citations=(Citation(...),), grounded=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lookahead_rag.services.retriever.citations import Citation, CitedPassage, Matcher, citations
from lookahead_rag.services.retriever.content_words import FUNCTION_WORDS
from lookahead_rag.services.retriever.word_match import words

MIN_NEW_WORDS = 1  # content words the answer must add to the question's (0: an answer restating it passes)
MIN_SUPPORTED_SHARE = 0.0  # of the answer's content weight, in sentences a passage supports (0: not asked)
MIN_NEW_WORDS_FOUND = 0.0  # of the content words the answer adds to the question, found in the passages (0: not asked)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the passages say of an answer, before any threshold (``ground`` judges it; bench quality's
    tuning reads it)."""

    citations: tuple[Citation, ...]  # the passages supporting the answer (citations.cite)
    share: float  # of the answer's content weight, in sentences a passage supports (0: it has none)
    new_words: int  # the content words it adds to the question's
    found: float | None  # of the content words it adds to the question, found in the passages (None: adds none)
    refusal: bool  # it is the refusal


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


def new_words(answer: str, matcher: Matcher) -> set[str]:
    """The content words ``answer`` adds to the question's (stemmed)."""
    return {w for w in _said(answer) if w not in FUNCTION_WORDS} - matcher.question


def new_words_found(answer: str, matcher: Matcher) -> float | None:
    """The share of the content words ``answer`` adds to the question that occur in the passages (None:
    it adds none)."""
    new = new_words(answer, matcher)
    if not new:
        return None
    held = set().union(*(index.at.keys() for index in matcher.indexes)) if matcher.indexes else set()
    return len(new & held) / len(new)


def evidence(answer: str, passages: Sequence[CitedPassage], question: str = "", refusal: str = "") -> Evidence:
    """``answer``'s citations and how much of it ``passages`` hold (to ``question``, when known)."""
    matcher = Matcher(passages, question)
    supported = matcher.answer(answer)
    total = sum(s.weight for s in supported)
    held = sum(s.weight for s in supported if s.support is not None)
    return Evidence(tuple(citations(supported)), held / total if total > 0 else 0.0, len(new_words(answer, matcher)),
                    new_words_found(answer, matcher), is_refusal(answer, refusal))


def ground(answer: str, passages: Sequence[CitedPassage], question: str = "", refusal: str = "") -> Grounding:
    """``answer``'s citations and whether ``passages`` support it (to ``question``, when known)."""
    e = evidence(answer, passages, question, refusal)
    if e.refusal:
        return Grounding(e.citations, True)
    grounded = (bool(passages) and e.new_words >= MIN_NEW_WORDS and e.share >= MIN_SUPPORTED_SHARE
                and (e.found is None or e.found >= MIN_NEW_WORDS_FOUND))
    return Grounding(e.citations, grounded)
