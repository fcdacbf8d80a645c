"""bench logprobs: the comparison of logprobs (hand-made lists), its flags, and a tiny real run (the real
model, 2 bundled prompts, 3 tokens, no kernel timing) that writes the JSON and PNG with equal answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lookahead_core.sampling.logprobs import TokenLogprob

from lookahead_rag.bench.logprobs_args import parse_args
from lookahead_rag.bench.logprobs_compare import (
    DIFFER,
    SAME,
    TIE,
    compare_logprobs,
    equal_answers,
    top_agreement,
    top_value_diff,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = 1e-6  # a difference a batched forward's rounding makes
RECORDED = ("model", "cpu", "machine", "threads", "dataset", "baseline", "top_logprobs", "wall_s")  # in every JSON
TOLERANCE = 1e-3  # the tiny run: engine vs baseline logprobs, fp32 on the same model
TINY_RUN = ["--limit", "2", "--max-new-tokens", "3", "--concurrency", "2", "--top", "3", "--no-calibrate",
            "--threads", "1"]  # 2 prompts, 3 tokens, one level, top 3, no kernel timing


def test_top_sets_compare_ids_not_order() -> None:
    # the same ids in another order (two equal values may come either way): the same set
    assert top_agreement(((5, -0.1), (7, -2.0)), ((7, -2.0), (5, -0.1))) == SAME
    # no top at all on either side (top_logprobs 0): the same (empty) set
    assert top_agreement((), ()) == SAME


def test_a_swap_at_the_boundary_is_a_tie_only_within_the_gap() -> None:
    ref = ((1, -0.5), (2, -1.0), (3, -3.0))
    # ours holds 4 in place of 3, both within 1e-6 of the baseline's 3rd value: a tie at the boundary
    assert top_agreement(((1, -0.5), (2, -1.0), (4, -3.0 + TINY)), ref) == TIE
    # 4 is well below the baseline's 3rd value: a real difference
    assert top_agreement(((1, -0.5), (2, -1.0), (4, -3.5)), ref) == DIFFER
    # ours is missing a top id the baseline held well above its boundary (2 at -1.0): a real difference
    assert top_agreement(((1, -0.5), (3, -3.0), (4, -3.0)), ref) == DIFFER
    # the baseline has no top but ours does: different
    assert top_agreement(((1, -0.5),), ()) == DIFFER


def test_top_values_compare_over_the_ids_both_hold() -> None:
    # ids 1 and 2 in both: |(-0.5) - (-0.5 - 1e-6)| and |(-1.0) - (-1.2)| -> 0.2; 9 and 3 are ignored
    assert top_value_diff(((1, -0.5), (2, -1.0), (9, -2.0)), ((2, -1.2), (1, -0.5 - TINY), (3, -2.5))) \
        == pytest.approx(0.2)
    # no id in common: nothing to measure
    assert top_value_diff(((1, -0.5),), ((2, -0.5),)) is None


def test_equal_answers_counts_token_for_token() -> None:
    # the first equal, the second one token off, the third shorter
    assert equal_answers([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [5, 6]]) == 1


def test_positions_are_compared_up_to_the_first_differing_token() -> None:
    ref = [TokenLogprob(1, -0.1, ((1, -0.1), (2, -2.5))), TokenLogprob(3, -0.4, ((3, -0.4), (4, -1.3))),
           TokenLogprob(5, -0.2, ((5, -0.2), (6, -2.0)))]
    ours = [TokenLogprob(1, -0.1 + TINY, ((1, -0.1 + TINY), (2, -2.5))),
            TokenLogprob(3, -0.4 - 2 * TINY, ((4, -1.3), (3, -0.4 - 2 * TINY))),
            TokenLogprob(6, -1.9, ((5, -0.25), (6, -1.9)))]  # differs here: not compared
    tally = compare_logprobs([[1, 3, 6]], [ours], [ref])
    assert tally.answers == 1 and tally.count_errors == 0
    assert tally.positions == 2 and tally.top_positions == 2 and tally.top_same == 2 and tally.top_ties == 0
    assert tally.max_abs_diff == pytest.approx(2 * TINY) and tally.max_top_diff == pytest.approx(2 * TINY)
    record = tally.record()
    assert record["top_same_frac"] == 1.0 and record["logprob_count_errors"] == 0


def test_missing_logprobs_and_a_different_top_are_counted() -> None:
    ref = [TokenLogprob(1, -0.1, ((1, -0.1), (2, -2.5))), TokenLogprob(3, -0.4, ((3, -0.4), (4, -1.3)))]
    # one logprob for a two-token output: a count error; its one position still compared
    short = [TokenLogprob(1, -0.1, ((1, -0.1), (7, -2.4)))]  # 7 in place of 2, 0.1 away: a different set
    tally = compare_logprobs([[1, 3]], [short], [ref])
    assert tally.count_errors == 1 and tally.positions == 1
    assert tally.top_same == 0 and tally.top_ties == 0 and tally.record()["top_same_frac"] == 0.0
    assert tally.max_abs_diff == 0.0 and tally.max_top_diff == 0.0  # id 1's value equal in both


def test_nothing_compared_reports_none() -> None:
    # the very first token differs: no position to compare, no maximum to report
    tally = compare_logprobs([[2]], [[TokenLogprob(2, -0.1)]], [[TokenLogprob(1, -0.2)]])
    assert tally.positions == 0 and tally.max_abs_diff is None
    assert tally.record()["top_same_frac"] is None and tally.record()["max_abs_top_diff"] is None


def test_the_flags() -> None:
    args = parse_args(["--concurrency", "1, 16", "--top", "20"])
    assert args.concurrency == [1, 16] and args.top == 20 and args.limit == 40 and args.max_new_tokens == 32
    assert args.mode == "hierarchical" and args.calibrate
    assert parse_args([]).concurrency == [1, 16] and parse_args([]).top == 5
    for bad in (["--top", "21"], ["--top", "-1"], ["--concurrency", "0"], ["--concurrency", "x"],
                ["--concurrency", ","], ["--limit", "0"], ["--max-new-tokens", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.slow
def test_a_tiny_run_writes_the_json_and_png_with_equal_answers(tmp_path: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lookahead_rag.bench import logprobs

    out = tmp_path / "logprobs.json"
    assert logprobs.report(parse_args([*TINY_RUN, "--json", str(out)])) == 0
    data = json.loads(out.read_text())
    assert (data["kind"], data["prompts"], data["max_new_tokens"], data["top_logprobs"]) == ("logprobs", 2, 3, 3)
    assert not [k for k in RECORDED if data.get(k) is None]
    assert [p["name"] for p in data["passes"]] == ["c2 off", "c2 on"]
    assert data["all_equal"]
    off, on = data["passes"]
    assert off["equal_to_baseline"] == on["equal_to_baseline"] == on["equal_to_off"] == 2
    assert off["tokens_per_s"] > 0 and on["on_off_ratio"] > 0
    assert on["logprob_count_errors"] == 0 and on["positions"] == on["new_tokens"] == on["top_positions"]
    assert on["top_same"] + on["top_ties"] == on["top_positions"]
    assert on["max_abs_logprob_diff"] < TOLERANCE and on["max_abs_top_diff"] < TOLERANCE
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
