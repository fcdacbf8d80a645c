"""bench quality's spread sample (bench/answer_quality_sample.py, issue 52): the file reordered so its first
questions spread over it, those the grounding check was tuned on last."""

from __future__ import annotations

from lookahead_rag.bench.answer_quality_sample import spread_order


def test_each_kind_is_spread_and_the_excluded_ids_go_last() -> None:
    rows = [{"id": str(i), "answerable": i % 3 != 0} for i in range(30)]
    got = spread_order(rows)
    kinds = [r["answerable"] for r in got]
    assert kinds == [True] * 20 + [False] * 10  # answerable first, then unanswerable
    assert sorted(got, key=lambda r: int(r["id"])) == rows  # every row once
    assert [r["id"] for r in got[:20]] != [r["id"] for r in rows if r["answerable"]]  # not the file's order
    first = got[0]["id"]
    again = spread_order(rows, exclude={first})
    assert again[19]["id"] == first and again[0]["id"] != first  # the excluded one is its kind's last
    assert [r["answerable"] for r in again] == kinds
