"""lookahead_rag.bench.squad_eval: SQuAD's exact match and F1, as the official evaluation script defines them."""

from __future__ import annotations

import pytest

from lookahead_rag.bench.squad_eval import (
    Score,
    abstains,
    exact_match,
    mean_score,
    normalize_answer,
    quality_row,
    score,
    token_f1,
)


def test_normalization_drops_case_punctuation_articles_and_extra_spaces() -> None:
    # every step of the official normalize_answer: lower, punctuation, a/an/the, whitespace
    assert normalize_answer("  The  Normans, of   NORMANDY!  ") == "normans of normandy"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theory") == "theory"  # "the" inside a word is not an article


def test_exact_match_is_equality_after_normalization() -> None:
    # equal once normalized: 1; a different word: 0
    assert exact_match("the 10th century.", "10th Century") == 1.0
    assert exact_match("10th and 11th centuries", "10th century") == 0.0


def test_f1_is_the_harmonic_mean_of_token_precision_and_recall() -> None:
    # 2 common tokens of 4 predicted and 2 reference: precision 1/2, recall 1, F1 2/3
    assert token_f1("in the 10th century, roughly", "10th century") == pytest.approx(2 / 3)
    assert token_f1("Denmark", "Norway") == 0.0
    # repeated words count as often as both sides hold them: 1 common of 2 predicted, 1 reference
    assert token_f1("France France", "France") == pytest.approx(2 / 3)


def test_empty_answers_score_only_against_empty_ones() -> None:
    # the v2.0 script's rule: an answer normalized to nothing matches only nothing
    assert token_f1("the", "") == 1.0
    assert token_f1("", "France") == 0.0


def test_a_prediction_scores_its_best_over_the_references() -> None:
    # EM from one reference, F1 from another: each is its own max
    got = score("in the 10th and 11th centuries", ["10th and 11th centuries", "in the 10th and 11th centuries"])
    assert got == Score(1.0, 1.0)
    partial = score("Rollo the Viking", ["Rollo", "Denmark"])
    assert partial.exact_match == 0.0 and partial.f1 == pytest.approx(2 * 0.5 * 1 / 1.5)
    with pytest.raises(ValueError):
        score("x", [])


def test_mean_score_averages_and_is_zero_for_none() -> None:
    # the mean of the per-question scores; no questions gives zeros, not a division error
    assert mean_score([Score(1.0, 1.0), Score(0.0, 0.5)]) == Score(0.5, 0.75)
    assert mean_score([]) == Score(0.0, 0.0)


def test_quality_row_is_the_mean_in_percent() -> None:
    # two answers: one exact (EM 1, F1 1), one half right (EM 0, F1 0.5) -> EM 50 %, F1 75 %
    row = quality_row([score("Paris", ["Paris"]), score("in Paris France", ["Paris"])])
    assert row == {"squad_em": 50.0, "squad_f1": 75.0, "squad_scored": 2}
    # nothing scored: no figure rather than a zero
    assert quality_row([]) == {"squad_em": None, "squad_f1": None, "squad_scored": 0}


@pytest.mark.parametrize(("answer", "says_so"), [
    ("The documents do not say.", True),  # the default prompt's own words
    ("The provided documents don't contain information about that.", True),  # apostrophe dropped by normalizing
    ("This is not mentioned in the documents.", True),
    ("I don't know.", True),
    ("The Normans were in Normandy in the 10th century.", False),  # an answer, however wrong
    ("", False),  # silence is not an abstention
])
def test_abstains_recognizes_saying_the_documents_do_not_hold_it(answer: str, says_so: bool) -> None:
    assert abstains(answer) is says_so
