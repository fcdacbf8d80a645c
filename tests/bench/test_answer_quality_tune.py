"""The grounding check's tuning (bench/answer_quality_tune.py, issue 52): its signals of a cached answer,
its rules' rates and the pick within the allowed wrong share, on hand-made rows."""

from __future__ import annotations

from lookahead_rag.bench.answer_quality_signals import half_of, sample, spread
from lookahead_rag.bench.answer_quality_tune import (
    Item,
    Rule,
    added,
    features,
    fork_logprob,
    fork_margin,
    pick,
    product_check,
    rates,
    right_withheld,
    separation,
    thresholds,
)

REFUSAL_IDS = [10, 11, 12]


def row(tokens: list[int], logprobs: list[float], path: list[float]) -> dict:
    return {"tokens": tokens, "logprobs": logprobs, "refusal_path_logprobs": path,
            "refusal_logprobs": [-1.0, -0.1, -0.1], "refusal_ids": REFUSAL_IDS}


def item(answerable: bool, signal: float, half: int = 0, refused: bool = False, f1: float = 0.0) -> Item:
    return Item(answerable, refused, {"s": signal}, half, f1)


def test_the_fork_is_where_the_answer_leaves_the_refusal() -> None:
    # "The Normans ...": it shares the refusal's first token, leaves it at the second (refusal's -3.0 there)
    r = row([10, 20, 21], [-0.5, -0.2, -0.1], [-0.5, -3.0])
    assert fork_logprob(r) == -3.0 and fork_margin(r) == -3.0 - (-0.2)
    # the answer is the refusal itself: no fork
    assert fork_logprob(row([10, 11, 12], [-0.5, -0.1, -0.1], [-0.5, -0.1, -0.1])) == 0.0


def test_a_rule_withholds_below_its_cut_and_the_models_own_refusal_always() -> None:
    items = [item(True, 0.9), item(True, 0.2, refused=True), item(False, 0.1), item(False, 0.8)]
    # unanswerable: the 0.1 one withheld (1 of 2); answerable: the model's own refusal (1 of 2)
    assert rates(Rule((("s", 0.5),)), items) == (50.0, 50.0)
    assert rates(Rule(()), items) == (0.0, 50.0)


def test_the_pick_takes_the_most_unanswerable_within_the_allowed_wrong_share() -> None:
    items = [*(item(True, v) for v in (0.5, 0.6, 0.7, 0.8, 0.9)), item(False, 0.1), item(False, 0.55)]
    rule, good, wrong = pick(items, [Rule((("s", t),)) for t in thresholds(items, "s")], max_wrong=0.0)
    # cutting above 0.5 would withhold an answerable one: the best allowed cut takes the 0.1 only
    assert good == 50.0 and wrong == 0.0 and rule.cuts[0][1] <= 0.5
    _, good, wrong = pick(items, [Rule((("s", t),)) for t in thresholds(items, "s")], max_wrong=20.0)
    assert good == 100.0 and wrong == 20.0  # one answerable of five may go: the 0.55 is withheld too


def test_the_sample_is_spread_and_halved_by_paragraph() -> None:
    rows = [{"id": str(i), "answerable": i % 3 != 0, "doc_id": f"A#{i % 4}"} for i in range(30)]
    got = sample(rows, 5, 2)
    assert [r["answerable"] for r in got] == [True] * 5 + [False] * 2
    assert spread(rows, 30) != rows  # not the file's order
    assert half_of("A#1") == half_of("A#1") and {half_of(f"A#{i}") for i in range(20)} == {0, 1}


def test_the_pick_allows_what_the_check_adds_beyond_the_models_own_refusals() -> None:
    # one answerable question of four the model itself refused: 25% withheld before any check
    items = [item(True, 0.9, refused=True), *(item(True, v) for v in (0.6, 0.7, 0.8)), item(False, 0.1)]
    rule, good, wrong = pick(items, [Rule((("s", t),)) for t in thresholds(items, "s")], max_wrong=0.0)
    assert (good, wrong) == (100.0, 25.0) and added(rule, items) == 0.0
    assert added(Rule((("s", 0.65),)), items) == 25.0  # the 0.6 one is the check's own


def test_right_answers_withheld_count_apart_from_wrong_ones() -> None:
    items = [item(True, 0.1, f1=1.0), item(True, 0.2, f1=0.0), item(True, 0.9, f1=1.0), item(True, 0.3, f1=0.4)]
    rule = Rule((("s", 0.5),))  # withholds three: one right (F1 1.0), two wrong
    assert added(rule, items) == 75.0 and right_withheld(rule, items) == 25.0


def test_an_answer_restating_the_question_adds_nothing_and_misses_nothing() -> None:
    passage = {"doc_id": "N#0", "chunk_id": "N#0#0", "text": "Rollo was the first ruler of Normandy.", "score": 0.7}
    base = {**row([1], [-0.1], []), "question": "Who was the first ruler of Normandy?", "passages": [passage]}
    echo = features({**base, "answer": "Normandy had a first ruler."}, "The documents do not say.")
    assert (echo["adds"], echo["found"]) == (0.0, 1.0)
    said = features({**base, "answer": "Rollo"}, "The documents do not say.")
    assert (said["adds"], said["found"], said["top_score"]) == (1.0, 1.0, 0.7)


def test_separation_is_one_when_the_signal_orders_the_questions_and_half_when_it_cannot() -> None:
    items = [item(True, 0.9), item(True, 0.8), item(False, 0.1), item(False, 0.2), item(False, 0.95, refused=True)]
    assert separation(items, "s") == 1.0  # the model's own refusal (0.95) is left out
    assert separation([item(True, 0.5), item(False, 0.5)], "s") == 0.5


def test_the_products_check_over_cached_answers() -> None:
    passage = {"doc_id": "N#0", "chunk_id": "N#0#0", "text": "Rollo was the first ruler of Normandy.", "score": 0.7}

    def q(answer: str, answerable: bool, f1: float | None) -> dict:
        return {"question": "Who was the first ruler of Normandy?", "passages": [passage], "answer": answer,
                "answerable": answerable, "f1": f1}

    data = {"refusal": "The documents do not say.", "questions": [
        q("Rollo", True, 1.0), q("The documents do not say.", True, 0.0),  # right; the model's own refusal
        q("Normandy had a first ruler.", False, None), q("Rollo", False, None)]}  # restated: withheld; kept
    assert product_check(data) == {"unanswerable_withheld_pct": 50.0, "answerable_withheld_pct": 50.0,
                                   "check_own_answerable_pct": 0.0, "right_withheld_pct": 0.0}
