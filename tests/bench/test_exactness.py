"""bench exactness: the comparison of answers and margins (hand-made lists), and a tiny real run with a
forced mismatch (the real model, 2 bundled prompts, 3 tokens, no kernel timing)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.bench.exactness_args import parse_args
from lookahead_rag.bench.exactness_compare import Mismatch, compare_pass, first_mismatch, margin_summary, min_margin

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_equal_answers_are_no_mismatch() -> None:
    assert first_mismatch(0, [1, 2, 3], [1, 2, 3], [4.0, 0.5, 2.0]) is None


def test_a_mismatch_names_its_first_position_and_the_baseline_margin_there() -> None:
    found = first_mismatch(3, [1, 2, 7, 8], [1, 2, 9, 8], [5.0, 2.0, 1e-5, 3.0])
    assert found == Mismatch(3, 2, 1e-5, 7, 9)
    assert found.tie  # a margin under bench.ties.TIE_LOGIT_GAP
    wide = first_mismatch(4, [6], [5], [2.5])
    assert wide == Mismatch(4, 0, 2.5, 6, 5) and not wide.tie
    assert wide.record() == {"index": 4, "position": 0, "margin": 2.5, "tie": False, "ours": 6, "reference": 5}


def test_an_answer_that_ended_first_is_a_mismatch_without_a_tie() -> None:
    # ours stopped (EOS) where the baseline went on: position = our length, the baseline's margin there
    assert first_mismatch(1, [1, 2], [1, 2, 3], [1.0, 1.0, 0.3]) == Mismatch(1, 2, 0.3, None, 3)
    # the baseline stopped first: no margin past its answer
    late = first_mismatch(2, [1, 2, 3], [1, 2], [1.0, 1.0])
    assert late == Mismatch(2, 2, None, 3, None) and not late.tie


def test_a_pass_counts_equal_answers_and_lists_every_mismatch_in_prompt_order() -> None:
    refs = [[1, 2], [3, 4], [5, 6]]
    margins = [[1.0, 2.0], [0.5, 3e-6], [4.0, 4.0]]
    tally = compare_pass([[1, 2], [3, 9], [7, 6]], refs, margins)
    assert tally.exact == 1
    assert tally.mismatches == [Mismatch(1, 1, 3e-6, 9, 4), Mismatch(2, 0, 4.0, 7, 5)]
    assert compare_pass(refs, refs, margins).mismatches == []


def test_the_smallest_margin_and_the_summary() -> None:
    assert min_margin([0.5, 2e-5, 3.0]) == (2e-5, 1)
    assert min_margin([]) == (None, None)
    summary = margin_summary([2e-5, 5e-3, 0.5, None])
    assert summary["answers"] == 3 and summary["min"] == 2e-5 and summary["median"] == 5e-3
    assert summary["below"] == {"1e-04": 1, "1e-03": 1, "1e-02": 2, "1e-01": 2}


def test_the_flags() -> None:
    args = parse_args(["--concurrency", "1, 16", "--cache", "off,warm"])
    assert args.concurrency == [1, 16] and args.cache == ["off", "warm"] and args.limit == 300
    assert args.calibrate
    for bad in (["--cache", "hot"], ["--concurrency", "0"], ["--concurrency", "x"], ["--limit", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.slow
def test_a_tiny_run_writes_every_field_and_reports_a_forced_mismatch(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lookahead_rag.bench import exactness

    real = exactness.baseline_answer
    forced: dict[str, Any] = {}

    def baseline_with_a_wrong_last_token(model: Any, ids: list[int], max_new: int) -> exactness.Reference:
        ref = real(model, ids, max_new)
        if not forced:  # the first prompt's reference gets a token the engine will not produce
            forced["position"], forced["margin"] = len(ref.tokens) - 1, ref.margins[-1]
            ref = exactness.Reference([*ref.tokens[:-1], ref.tokens[-1] + 1], ref.margins)
        return ref

    monkeypatch.setattr(exactness, "baseline_answer", baseline_with_a_wrong_last_token)
    out = tmp_path / "exactness.json"
    args = parse_args(["--limit", "2", "--max-new-tokens", "3", "--concurrency", "2", "--cache", "off,warm",
                       "--no-calibrate", "--threads", "1", "--json", str(out)])
    assert exactness.report(args) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "exactness" and data["prompts"] == 2 and data["max_new_tokens"] == 3
    for key in ("model", "cpu", "machine", "threads", "dataset", "baseline", "margins", "per_answer", "wall_s"):
        assert data[key] is not None, key
    assert [p["name"] for p in data["passes"]] == ["c2 off", "c2 warm"]  # the unreported "on" pass only fills
    warm = data["passes"][1]
    assert warm["prompts_with_hits"] == 2 and warm["prefix_hit_tokens"] > 0
    assert data["passes"][0]["prefix_hit_tokens"] == 0
    assert data["mismatches_total"] == 2  # the forced one, in each pass; the other prompt is exact
    for p in data["passes"]:
        assert p["exact"] == 1 and p["answers"] == 2
        (mm,) = p["mismatches"]
        assert (mm["index"], mm["position"]) == (0, forced["position"])
        assert mm["margin"] == pytest.approx(forced["margin"])
        assert mm["gap"] is not None  # the baseline's logit of the (forced) token minus ours, re-measured
    answers = data["per_answer"]
    assert len(answers) == 2 and all(a["min_margin"] is not None and 1 <= a["new_tokens"] <= 3 for a in answers)
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
