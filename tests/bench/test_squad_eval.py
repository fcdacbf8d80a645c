"""lookahead_rag.bench.squad_eval: SQuAD's exact match and F1, as the official evaluation script defines them."""

from __future__ import annotations

import pytest

from lookahead_rag.bench.squad_eval import Score, exact_match, mean_score, normalize_answer, score, token_f1


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
