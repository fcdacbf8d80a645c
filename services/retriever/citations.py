"""Citations: which passages support an answer, found by matching the answer to them after generation.

No model call: each sentence of the answer (a short answer is one sentence) is looked for in every
passage, case- and space-insensitively. A passage supports a sentence when it holds the sentence
whole, or its longest run of shared words (``MIN_RUN_WORDS`` at least, or the whole sentence when it
is shorter) covers at least ``MIN_COVER`` of the sentence's words. A citation names the passage
(document id, chunk id) and the character span of the matched run in the passage's text, so a client
can highlight it; an answer that no passage supports (an abstention, a made-up answer) has none.

    cite("Denmark, Iceland and Norway", [CitedPassage("Normans#0", "Normans#0#0", text)])
    -> [Citation("Normans#0", "Normans#0#0", start, end, "Denmark, Iceland and Norway")]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MIN_RUN_WORDS = 3  # a run shorter than this supports only a sentence of that length
MIN_COVER = 0.5  # share of a sentence's words its longest run must cover
MAX_CITATIONS = 8  # per answer
_WORD = re.compile(r"\w+", re.UNICODE)
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


def _words(text: str) -> list[tuple[str, int, int]]:
    """(lowercased word, start, end) of every word of ``text``."""
    return [(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text)]


def _longest_run(sentence: list[str], passage: list[tuple[str, int, int]]) -> tuple[int, int, int]:
    """(length, start index in passage, end index) of the longest run of words shared in order."""
    best = (0, 0, 0)
    prev = [0] * (len(sentence) + 1)
    for j, (word, _, _) in enumerate(passage):
        cur = [0] * (len(sentence) + 1)
        for i, w in enumerate(sentence):
            if w == word:
                cur[i + 1] = prev[i] + 1
                if cur[i + 1] > best[0]:
                    best = (cur[i + 1], j + 1 - cur[i + 1], j + 1)
        prev = cur
    return best


def _support(sentence: str, passage: CitedPassage) -> Citation | None:
    words = [w for w, _, _ in _words(sentence)]
    if not words:
        return None
    pwords = _words(passage.text)
    run, first, last = _longest_run(words, pwords)
    if run == 0 or run < min(MIN_RUN_WORDS, len(words)) or run < MIN_COVER * len(words):
        return None
    start, end = pwords[first][1], pwords[last - 1][2]
    return Citation(passage.doc_id, passage.chunk_id, start, end, passage.text[start:end])


def sentences(answer: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(answer) if s.strip()]


def cite(answer: str, passages: Sequence[CitedPassage]) -> list[Citation]:
    """The passages supporting ``answer``: per sentence, the passage with the longest supporting run."""
    found: list[Citation] = []
    for sentence in sentences(answer):
        best: Citation | None = None
        for passage in passages:
            c = _support(sentence, passage)
            if c is not None and (best is None or c.end - c.start > best.end - best.start):
                best = c
        if best is not None and best not in found:
            found.append(best)
        if len(found) >= MAX_CITATIONS:
            break
    return found
