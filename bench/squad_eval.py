"""SQuAD's answer scoring: exact match and token F1 against the reference answers (max over them).

The official evaluation script's definitions (SQuAD v2.0's ``evaluate-v2.0.py``): both sides are
normalized (lowercase, punctuation removed, the articles a / an / the removed, whitespace collapsed);
exact match is equality of the normalized strings, F1 the harmonic mean of token precision and
recall over the normalized words (a bag: a word counts as often as it appears on both sides). A
prediction scores its best over the references. Pure Python: no model, no torch.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, no punctuation, no articles, single spaces (the official script's order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the normalized words; an empty side scores 1.0 only against another empty side."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Score:
    """One prediction's score: the best over its references."""

    exact_match: float  # 0.0 or 1.0
    f1: float  # 0.0 .. 1.0


def score(prediction: str, references: Sequence[str]) -> Score:
    """The prediction's exact match and F1, each the max over ``references`` (at least one)."""
    if not references:
        raise ValueError("no reference answers to score against")
    return Score(max(exact_match(prediction, r) for r in references), max(token_f1(prediction, r) for r in references))


def mean_score(scores: Sequence[Score]) -> Score:
    """The mean exact match and F1 over the scored predictions (0 for none)."""
    n = max(len(scores), 1)
    return Score(sum(s.exact_match for s in scores) / n, sum(s.f1 for s in scores) / n)


PERCENT = 100.0  # scores are reported in percent
QUALITY_COLUMNS = [("squad_em", "EM %", ".1f"), ("squad_f1", "F1 %", ".1f")]  # table columns of quality_row


def quality_row(scores: Sequence[Score]) -> dict[str, float | int | None]:
    """Mean SQuAD EM and F1 in percent over ``scores`` (None when nothing was scored), and how many."""
    if not scores:
        return {"squad_em": None, "squad_f1": None, "squad_scored": 0}
    mean = mean_score(scores)
    return {"squad_em": round(mean.exact_match * PERCENT, 2), "squad_f1": round(mean.f1 * PERCENT, 2),
            "squad_scored": len(scores)}


# Phrases (normalized as answers are) by which an answer says the documents do not hold what was asked.
ABSTAIN_PHRASES = (
    "do not say", "does not say", "dont say", "doesnt say", "do not contain", "does not contain", "dont contain",
    "doesnt contain", "do not mention", "does not mention", "not mentioned", "no information", "not provided",
    "not specified", "not stated", "cannot be determined", "cannot answer", "can not answer", "unable to answer",
    "i dont know", "do not know", "not enough information", "no mention",
)


def abstains(answer: str) -> bool:
    """Whether ``answer`` says the documents do not hold the answer (for unanswerable questions)."""
    text = normalize_answer(answer)
    return any(phrase in text for phrase in ABSTAIN_PHRASES)
