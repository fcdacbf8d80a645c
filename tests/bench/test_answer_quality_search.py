"""bench quality's search comparison and its distractors: the pure parts (no model, no embedding)."""

from __future__ import annotations

import pytest

from lookahead_rag.bench.answer_quality_search import (
    DISTRACTOR_PREFIX,
    search_names,
    setting_name,
    with_distractors,
)
from lookahead_rag.bench.distractors import SKIPPED_PREFIXES, build
from lookahead_rag.bench.serve_load import Question, Workload
from lookahead_rag.services.retriever.documents import Document


def test_hybrid_values_name_the_searches_once_each_in_order() -> None:
    # --hybrid off,on -> both, in the order given; repeated values once; none given -> the retriever's default
    assert search_names(["off", "on"], default_hybrid=False) == ["dense", "hybrid"]
    assert search_names(["on", "off", "on"], default_hybrid=False) == ["hybrid", "dense"]
    assert search_names([], default_hybrid=True) == ["hybrid"]
    assert search_names([], default_hybrid=False) == ["dense"]


def test_every_tenant_gets_every_distractor_under_its_own_ids() -> None:
    # two tenants, one distractor: each tenant holds its own document and the distractor, whose id cannot
    # collide with a corpus id
    wl = Workload({"a": [Document("x", "", "a text")], "b": [Document("y", "", "b text")]}, [Question("1", "a", "q")])
    grown = with_distractors(wl, [{"id": "x", "title": "t", "text": "other text"}])
    assert [d.id for d in grown.docs["a"]] == ["x", f"{DISTRACTOR_PREFIX}x"]
    assert [d.id for d in grown.docs["b"]] == ["y", f"{DISTRACTOR_PREFIX}x"]
    assert grown.pool == wl.pool


def test_settings_are_named_by_k_and_ratio() -> None:
    # a fixed k has no ratio in its name; an adaptive one shows it
    assert setting_name("in_prompt", 3, 0.0) == "in_prompt@3"
    assert setting_name("passages", 5, 0.8) == "passages@5 r=0.8"


def test_distractors_are_real_docstrings_up_to_the_chunk_count() -> None:
    # a small target: enough documents to reach it, each id once, none from a skipped module
    docs, chunks = build(50, [])
    assert chunks >= 50
    assert len({d["id"] for d in docs}) == len(docs)
    assert all(d["text"].strip() for d in docs)
    assert not any(part.startswith(SKIPPED_PREFIXES) for d in docs for part in d["id"].split("."))


def test_orders_are_checked_and_kept_in_the_order_given() -> None:
    from lookahead_rag.bench.answer_quality_args import parse_args

    # --orders names the passage orders answered with; none given: all three
    assert parse_args(["--orders", "score_last,canonical"]).orders == ["score_last", "canonical"]
    assert parse_args([]).orders == ["canonical", "score", "score_last"]
    # an unknown order is a usage error (exit 2), not a run without answers
    with pytest.raises(SystemExit) as exc:
        parse_args(["--orders", "random"])
    assert exc.value.code == 2
