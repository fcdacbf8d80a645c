"""Chunking: exact offsets, overlap, boundaries, coverage."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead_rag.services.retriever.chunking import chunk_spans
from lookahead_rag.services.retriever.documents import Document, make_chunks

PARAGRAPHS = "\n\n".join(
    " ".join(f"Sentence {p}.{s} says something about topic {p} with a few more words." for s in range(6))
    for p in range(8)
)


def test_short_text_is_one_chunk_trimmed() -> None:
    text = "  A short document.  \n"
    spans = chunk_spans(text, chunk_chars=100, overlap=10)
    assert [(s.start, s.end) for s in spans] == [(2, 19)]
    assert spans[0].of(text) == "A short document."


def test_chunks_are_exact_slices_with_offsets() -> None:
    doc = Document(id="d", title="T", text=PARAGRAPHS, source="src.txt")
    chunks = make_chunks(doc, chunk_chars=300, overlap=60)
    assert len(chunks) > 3
    for n, chunk in enumerate(chunks):
        assert chunk.chunk_id == f"d#{n}"
        assert chunk.doc_id == "d" and chunk.source == "src.txt" and chunk.title == "T"
        assert doc.text[chunk.start : chunk.end] == chunk.text
        assert 0 < len(chunk.text) <= 300


def test_chunks_end_on_sentence_or_paragraph_boundaries() -> None:
    chunks = make_chunks(Document("d", "T", PARAGRAPHS), chunk_chars=300, overlap=60)
    for chunk in chunks[:-1]:
        assert chunk.text.endswith("."), chunk.text[-30:]


def test_consecutive_chunks_overlap() -> None:
    chunks = make_chunks(Document("d", "T", PARAGRAPHS), chunk_chars=300, overlap=60)
    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.start < prev.end, "no overlap"
        assert nxt.start > prev.start, "no progress"
        # the next chunk starts at a sentence start, not mid-word
        assert PARAGRAPHS[nxt.start - 1].isspace()


def test_text_without_any_break_is_cut_hard() -> None:
    text = "x" * 250
    spans = chunk_spans(text, chunk_chars=100, overlap=20)
    assert spans[0].end == 100
    assert spans[-1].end == 250
    assert all(s.end - s.start <= 100 for s in spans)


def test_overlap_must_be_below_chunk_size() -> None:
    with pytest.raises(ValueError, match="overlap"):
        chunk_spans("abc", chunk_chars=10, overlap=10)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab .\n!?"), max_size=600),
    chunk_chars=st.integers(min_value=20, max_value=200),
    overlap_frac=st.floats(min_value=0.0, max_value=0.9),
)
def test_every_non_space_character_is_covered(text: str, chunk_chars: int, overlap_frac: float) -> None:
    overlap = int(chunk_chars * overlap_frac)
    spans = chunk_spans(text, chunk_chars, overlap)
    covered = [False] * len(text)
    for span in spans:
        assert 0 <= span.start < span.end <= len(text)
        assert span.end - span.start <= chunk_chars
        assert not span.of(text)[0].isspace() and not span.of(text)[-1].isspace()
        for i in range(span.start, span.end):
            covered[i] = True
    assert all(covered[i] or ch.isspace() for i, ch in enumerate(text))
    assert [s.start for s in spans] == sorted({s.start for s in spans})
