"""Citations: which passages support an answer, found by matching the answer to them after generation.

No model call: each sentence of the answer (a short answer is one sentence) is matched against every
passage, case- and punctuation-insensitively (``word_match``: linear in the words they share). A passage
supports a sentence when one window of it (at most ``WINDOW_FACTOR`` times the sentence's length) holds
at least ``MIN_COVER`` of the sentence's content weight (``content_words``: function words count nothing,
the question's own words a quarter), or a run copied word for word holds ``MIN_COPIED`` of it; so a
sentence answer is tied to the passage holding the span inside it, not to one that repeats the question.
Among passages that support a sentence equally, the one it was copied from wins: the longest run copied
word for word, then the most of the question's words, then retrieval order. A citation names the passage
(document id, chunk id) and the character span of the supporting text, from its first matched word to its
last, never the whole chunk; an answer no passage supports (an abstention, a made-up answer) has none.

    cite("Denmark, Iceland and Norway", [CitedPassage("Normans#0", "Normans#0#0", text)])
    -> [Citation("Normans#0", "Normans#0#0", start, end, "Denmark, Iceland and Norway")]
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lookahead_rag.services.retriever.content_words import FUNCTION_WORDS, content_weights
from lookahead_rag.services.retriever.word_match import PassageIndex, best_window, runs, words

MIN_COVER = 0.6  # share of a sentence's content weight one window of a passage must hold, or ...
MIN_COPIED = 2.0  # ... the content weight one run copied word for word from it holds (two new words)
WINDOW_FACTOR = 2  # a supporting window spans at most this many times the sentence's words ...
MIN_WINDOW_WORDS = 8  # ... and at least this many passage words
MAX_CITATIONS = 8  # per answer
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True, slots=True)
class CitedPassage:
    doc_id: str
    chunk_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Citation:
    doc_id: str
    chunk_id: str
    start: int  # character offsets of the supporting span in the passage's text
    end: int
    quote: str = ""  # passage.text[start:end]


@dataclass(frozen=True, slots=True)
class Support:
    """One sentence's best supporting passage."""

    citation: Citation
    cover: float  # share of the sentence's content weight the span holds (MIN_COVER .. 1)


@dataclass(frozen=True, slots=True)
class SentenceSupport:
    """One sentence of an answer, its content weight, and the passage supporting it (None: none does)."""

    text: str
    weight: float  # its content words' weight (content_words)
    support: Support | None


def let_go() -> None:
    """Lets go of the GIL between passages and sentences: a thread matching a long answer never holds an
    event loop waiting for more than one sentence's work (issue 51, finding 5)."""
    time.sleep(0)


def sentences(answer: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(answer) if s.strip()]


class Matcher:
    """The passages of one answer, each indexed once, and the question's content words."""

    def __init__(self, passages: Sequence[CitedPassage], question: str = "") -> None:
        self.passages = list(passages)
        self.indexes = []
        for p in self.passages:
            self.indexes.append(PassageIndex(p.text))
            let_go()
        self.question = {w for w, _, _ in words(question)} - FUNCTION_WORDS
        self.question_hits = [len(self.question & index.at.keys()) for index in self.indexes]

    def sentence(self, text: str) -> SentenceSupport:
        """``text``'s best supporting passage: the most cover, then the longest copied run, then the most
        question words, then the earliest passage."""
        said = [w for w, _, _ in words(text)]
        weight = content_weights(said, self.question)
        total = sum(weight.values())
        width = max(WINDOW_FACTOR * len(said), MIN_WINDOW_WORDS)
        best: tuple[tuple[float, int, int, int], Support] | None = None
        for k, (passage, index) in enumerate(zip(self.passages, self.indexes, strict=True)):
            held = sum(v for w, v in weight.items() if w in index.at)  # the most any window of it can cover
            if not total or held < min(MIN_COVER * total, MIN_COPIED) or (best and held / total < best[0][0]):
                continue
            window = best_window(said, runs(said, index, weight.keys()), weight, width)
            if window is None or (window.covered < MIN_COVER * total and window.copied < MIN_COPIED):
                continue
            key = (window.covered / total, window.longest, self.question_hits[k], -k)
            if best is None or key > best[0]:
                start, end = index.span(window.first, window.last)
                citation = Citation(passage.doc_id, passage.chunk_id, start, end, passage.text[start:end])
                best = (key, Support(citation, key[0]))
        return SentenceSupport(text, total, best[1] if best else None)

    def answer(self, answer: str) -> list[SentenceSupport]:
        out = []
        for s in sentences(answer):
            out.append(self.sentence(s))
            let_go()
        return out


def citations(supported: Sequence[SentenceSupport]) -> list[Citation]:
    """The distinct citations of an answer's sentences, in order, at most ``MAX_CITATIONS``."""
    found: list[Citation] = []
    for s in supported:
        if s.support is not None and s.support.citation not in found:
            found.append(s.support.citation)
    return found[:MAX_CITATIONS]


def cite(answer: str, passages: Sequence[CitedPassage], question: str = "") -> list[Citation]:
    """The passages supporting ``answer`` (to ``question``, when known): per sentence, its best passage."""
    return citations(Matcher(passages, question).answer(answer))
