"""The adaptive passage count: keep passages while their score stays near the best one."""

from __future__ import annotations

from typing import Any

import pytest

from lookahead_rag.services.retriever.adaptive_k import passages_to_keep
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.embeddings import Embedder
from tests.services.retriever_helpers import settings


def test_passages_far_below_the_best_are_left_out() -> None:
    # 0.35 is below 0.8 * 0.6 = 0.48: the list ends before it, and after it too
    assert passages_to_keep([0.6, 0.55, 0.35, 0.5], min_ratio=0.8, min_passages=1) == 2


def test_a_ratio_of_zero_keeps_every_passage() -> None:
    # the rule off: the fixed k as before
    assert passages_to_keep([0.6, 0.1, 0.05], min_ratio=0.0, min_passages=1) == 3


def test_the_minimum_is_kept_whatever_the_scores() -> None:
    # the second passage is far below the best, but two are asked for at least
    assert passages_to_keep([0.9, 0.1, 0.05], min_ratio=0.9, min_passages=2) == 2


def test_passages_all_near_the_best_are_all_kept() -> None:
    # every score within the ratio: nothing is cut
    assert passages_to_keep([0.5, 0.49, 0.48], min_ratio=0.9, min_passages=1) == 3


def test_a_best_score_at_or_below_zero_keeps_the_ranked_list() -> None:
    # with no positive best score the ratio has nothing to measure against
    assert passages_to_keep([-0.1, -0.2], min_ratio=0.9, min_passages=1) == 2


def test_no_passages_keep_none() -> None:
    # nothing retrieved: nothing to keep
    assert passages_to_keep([], min_ratio=0.5, min_passages=1) == 0


@pytest.mark.parametrize(("ratio", "minimum"), [(-0.1, 1), (1.5, 1), (0.5, 0)])
def test_out_of_range_arguments_are_refused(ratio: float, minimum: int) -> None:
    # a ratio outside [0, 1] or a minimum under one is a configuration error
    with pytest.raises(ValueError, match="must be"):
        passages_to_keep([0.5], min_ratio=ratio, min_passages=minimum)


def test_the_retriever_prompts_with_the_passages_near_the_best_only(embedder: Embedder, tok: Any) -> None:
    # "How do I write JSON?": json.dumps scores far above the three unrelated passages
    docs = [Document("json.dumps", "json.dumps(obj, ...)", "Serialize obj to a JSON formatted str."),
            Document("csv.reader", "csv.reader(f)", "Return a reader object that iterates over lines in a CSV file."),
            Document("os.path.splitext", "os.path.splitext(p)", "Split the extension from a pathname."),
            Document("heapq.nlargest", "heapq.nlargest(n, iterable)", "Find the n largest elements in a dataset.")]
    fixed = RetrieverCore(settings(None), embedder=embedder, tokenizer=tok)
    adaptive = RetrieverCore(settings(None, passage_min_score_ratio=0.8), embedder=embedder, tokenizer=tok)
    for core in (fixed, adaptive):
        core.ingest("t", docs)
    assert len(fixed.retrieve("t", "How do I write JSON?", k=4).chunks) == 4
    assert [c.chunk.doc_id for c in adaptive.retrieve("t", "How do I write JSON?", k=4).chunks] == ["json.dumps"]
