"""The order kept passages are shown in: canonical (by document, then chunk number) or by score.

Canonical order puts the same passages in the same place whatever their scores, so two questions that
retrieve them share the prompt's prefix through the documents block (the engine's prefix cache hits it).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document, make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.prompt import (
    PAST_HEADER,
    QUESTION_LABEL,
    Passage,
    PassageOrder,
    PastAnswer,
    build_prompt,
)
from tests.services.retriever_helpers import settings

SYSTEM = "Answer from the documents."
QUESTION = "How do I serialize an object to a JSON string?"
OTHER_QUESTION = "Which function turns a Python object into JSON text?"
MIN_TRUNC = 8
WIDE_BUDGET = 4000
# (doc_id, chunk, title): canonical order is this list's order; chunk 10 comes after chunk 2 (numeric)
KEYS = [("csv", 0, "csv.writer"), ("json", 2, "json.dumps part 2"), ("json", 10, "json.dumps part 10"),
        ("pickle", 1, "pickle.dumps")]
BODY = " Serialize and write objects with this function, as the conversion table says."
REPEATS = 4  # sentences per passage: long enough to be cut at a token boundary


def passages(scores: list[float]) -> list[Passage]:
    """KEYS' passages with these scores, handed over best score first (as a search returns them)."""
    made = [Passage(title, title + BODY * REPEATS, s, doc, n) for (doc, n, title), s in zip(KEYS, scores, strict=True)]
    return sorted(made, key=lambda p: -p.score)


def build(tok: Any, found: list[Passage], *, budget: int = WIDE_BUDGET, question: str = QUESTION,
          answers: list[PastAnswer] | None = None, order: PassageOrder = PassageOrder.CANONICAL) -> Any:
    return build_prompt(tok, question, found, answers or [], budget, SYSTEM, MIN_TRUNC, order)


def shown_titles(found: list[Passage], built: Any) -> list[str]:
    return [found[i].title for i, _ in built.passages]


def docs_block_tokens(tok: Any, text: str) -> int:
    """Tokens of ``text`` that end before the block after the documents (past answers, else the question)."""
    end = text.find(PAST_HEADER)
    end = end if end >= 0 else text.index(QUESTION_LABEL)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sum(1 for _, stop in offsets if stop <= end)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("scores", list(itertools.permutations([0.9, 0.7, 0.5, 0.3])))
def test_canonical_order_whatever_the_scores(tok: Any, scores: tuple[float, ...]) -> None:
    # every score ranking shows the passages by (doc id, chunk number), numbered [1]..[4] in that order
    found = passages(list(scores))
    built = build(tok, found)
    assert shown_titles(found, built) == [title for _, _, title in KEYS]
    positions = [built.text.index(f"[{n}] {title}\n") for n, (_, _, title) in enumerate(KEYS, start=1)]
    assert positions == sorted(positions)


def test_chunk_numbers_order_numerically_not_as_text(tok: Any) -> None:
    # "json#10" after "json#2": as strings "10" < "2" would put part 10 first
    found = passages([0.1, 0.2, 0.9, 0.3])  # part 10 scores best
    titles = shown_titles(found, build(tok, found))
    assert titles.index("json.dumps part 2") < titles.index("json.dumps part 10")


def test_chunk_number_is_the_last_part_of_the_id_even_when_the_doc_id_holds_the_separator() -> None:
    # squad-style doc ids ("Normans#0") hold "#" themselves: the chunk number is what follows the last one
    chunks = make_chunks(Document("Normans#3", "Normans", "word " * 400), chunk_chars=200, overlap=20)
    assert len(chunks) > 10
    assert [c.number() for c in chunks] == list(range(len(chunks)))
    assert chunks[0].chunk_id == "Normans#3#0"


def test_score_setting_keeps_best_first(tok: Any) -> None:
    # PassageOrder.SCORE: today's order, best score first whatever the documents
    found = passages([0.3, 0.9, 0.5, 0.7])
    built = build(tok, found, order=PassageOrder.SCORE)
    assert shown_titles(found, built) == ["json.dumps part 2", "pickle.dumps", "json.dumps part 10", "csv.writer"]
    assert [found[i].score for i, _ in built.passages] == [0.9, 0.7, 0.5, 0.3]


def test_score_last_setting_puts_the_best_passage_next_to_the_question(tok: Any) -> None:
    # PassageOrder.SCORE_LAST: best last, the end of the documents block that "lost in the middle" finds used best
    found = passages([0.3, 0.9, 0.5, 0.7])
    built = build(tok, found, order=PassageOrder.SCORE_LAST)
    assert [found[i].score for i, _ in built.passages] == [0.3, 0.5, 0.7, 0.9]


def test_past_answers_stay_after_the_documents_best_first(tok: Any) -> None:
    # past answers follow the documents block in score order, whatever the passage order
    answers = [PastAnswer("q low", "a low", 0.2), PastAnswer("q high", "a high", 0.95)]
    built = build(tok, passages([0.9, 0.7, 0.5, 0.3]), answers=answers)
    assert [i for i, _ in built.answers] == [1, 0]
    assert built.text.index("[4] pickle.dumps") < built.text.index(PAST_HEADER)
    assert built.text.index("answered \"a high\"") < built.text.index("answered \"a low\"")


@pytest.mark.parametrize("with_past", [False, True])
def test_same_passages_in_another_score_order_share_the_documents_block(tok: Any, with_past: bool) -> None:
    # two questions retrieving the same passages, ranked differently (and remembering different past
    # answers), get token-identical prompts through the end of the documents block
    first = build(tok, passages([0.9, 0.7, 0.5, 0.3]), answers=[PastAnswer("q1", "a1", 0.5)] if with_past else None)
    second = build(tok, passages([0.3, 0.5, 0.7, 0.9]), question=OTHER_QUESTION,
                   answers=[PastAnswer("q2", "a2", 0.5)] if with_past else None)
    shared = docs_block_tokens(tok, first.text)
    assert shared == docs_block_tokens(tok, second.text)
    assert common_prefix(first.ids, second.ids) >= shared
    assert first.ids != second.ids  # the questions differ after it
    # in score order the same two prompts part inside the documents block: the test can tell
    by_score = [build(tok, passages(s), order=PassageOrder.SCORE) for s in ([0.9, 0.7, 0.5, 0.3], [0.3, 0.5, 0.7, 0.9])]
    assert common_prefix(by_score[0].ids, by_score[1].ids) < docs_block_tokens(tok, by_score[0].text)


@pytest.mark.parametrize("cut_tokens", [12, 30, 45])
def test_a_cut_passage_shown_first_still_fits_the_budget(tok: Any, cut_tokens: int) -> None:
    # the lowest-scored passage is canonically first ("csv"): cut to fit, it is shown at [1], and the
    # prompt stays within the budget with every better passage whole
    found = passages([0.1, 0.9, 0.8, 0.7])
    budget = len(build(tok, found).ids) - cut_tokens
    built = build(tok, found, budget=budget)
    assert len(built.ids) <= budget and built.truncated
    index, chars = built.passages[0]
    assert found[index].title == "csv.writer" and 0 < chars < len(found[index].text)
    assert f"[1] csv.writer\n{found[index].text[:chars]}\n\n[2] json.dumps part 2\n" in built.text
    assert all(chars == len(found[i].text) for i, chars in built.passages[1:])
    assert built.ids == tok(built.text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("budget", [150, 200, 260, 320])
def test_what_is_kept_is_chosen_by_score_in_either_order(tok: Any, budget: int) -> None:
    # the order changes where passages are shown, not which ones fit: every order keeps the same set
    found = passages([0.1, 0.9, 0.8, 0.7])
    canonical, *others = (build(tok, found, budget=budget, order=o) for o in PassageOrder)
    assert all(len(b.ids) <= budget for b in (canonical, *others))
    kept = sorted(i for i, _ in canonical.passages)
    assert kept == list(range(len(kept)))  # a best-first prefix of the ranking
    assert all({i for i, _ in b.passages} == set(kept) for b in others)


DOCS = [
    Document("json.dumps", "json.dumps(obj, ...)", "Serialize obj to a JSON formatted str."),
    Document("csv.reader", "csv.reader(f)", "Return a reader object that iterates over lines in a CSV file."),
    Document("os.path.splitext", "os.path.splitext(p)", "Split the extension from a pathname."),
]
EXTENSION_QUESTION = "get the file extension of a path"


@pytest.mark.parametrize("order", list(PassageOrder))
def test_retrieve_returns_chunks_in_the_prompts_order(embedder: Embedder, tok: Any, order: PassageOrder) -> None:
    # RetrieveResult.chunks[n - 1] is the passage shown as [n]: canonical by doc id, or best first
    core = RetrieverCore(settings(passage_order=order), embedder=embedder, tokenizer=tok)
    core.ingest("t", DOCS)
    result = core.retrieve("t", EXTENSION_QUESTION, k=len(DOCS))
    ids = [c.chunk.doc_id for c in result.chunks]
    best_first = [c.chunk.doc_id for c in core.search("t", EXTENSION_QUESTION, len(DOCS))]
    assert best_first[0] == "os.path.splitext"  # canonically last: the two orders differ
    expected = {PassageOrder.CANONICAL: sorted(ids), PassageOrder.SCORE: best_first,
                PassageOrder.SCORE_LAST: best_first[::-1]}
    assert ids == expected[order]
    positions = [result.prompt.index(f"[{n}] {c.chunk.title}\n") for n, c in enumerate(result.chunks, start=1)]
    assert positions == sorted(positions)
