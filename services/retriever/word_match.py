"""Word-level matching of an answer's sentence against a passage, linear in the words they share.

A passage is indexed once (each lowercased word's positions); a sentence is matched by walking its
words through that index, so the work is the number of (sentence word, passage occurrence) pairs,
not sentence words x passage words. What comes out:

- ``runs``: the maximal runs of words the two share in order through a content word (``Run(i, j, n)``:
  sentence words ``i..i+n`` equal passage words ``j..j+n``);
- ``best_window``: the passage window (at most ``width`` words) whose runs cover the most weight of the
  sentence's words, trimmed to the runs it needs: the supporting text, never the whole chunk.

    index = PassageIndex("The Normans came from Denmark, Iceland and Norway.")
    runs(["from", "denmark"], index, {"denmark"})  -> [Run(0, 3, 2)]
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from lookahead_rag.services.retriever.content_words import stem

_WORD = re.compile(r"\w+", re.UNICODE)

Word = tuple[str, int, int]  # (stemmed lowercased word, start, end character offsets)


def words(text: str) -> list[Word]:
    """(stemmed lowercased word, start, end) of every word of ``text`` (``content_words.stem``)."""
    lowered = text.lower()
    if len(lowered) == len(text):  # offsets agree (a few letters, such as "İ", lengthen when lowercased)
        return [(stem(m.group()), m.start(), m.end()) for m in _WORD.finditer(lowered)]
    return [(stem(m.group().lower()), m.start(), m.end()) for m in _WORD.finditer(text)]


class PassageIndex:
    """A passage's words and, for each word, the positions where it occurs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.words = words(text)
        self.keys = [w for w, _, _ in self.words]
        self.at: dict[str, list[int]] = defaultdict(list)
        for j, (w, _, _) in enumerate(self.words):
            self.at[w].append(j)

    def span(self, first: int, last: int) -> tuple[int, int]:
        """Character offsets of passage words ``first..last`` (inclusive)."""
        return self.words[first][1], self.words[last][2]


@dataclass(frozen=True, slots=True)
class Run:
    i: int  # first sentence word
    j: int  # first passage word
    n: int  # words in the run


def runs(sentence: Sequence[str], index: PassageIndex, anchors: Collection[str]) -> list[Run]:
    """Every maximal run of words ``sentence`` and the passage share in order that holds one of ``anchors``
    (the content words: a run of function words alone supports nothing)."""
    seen: set[tuple[int, int]] = set()
    out: list[Run] = []
    keys = index.keys
    for i, w in enumerate(sentence):
        if w not in anchors:
            continue
        for j in index.at.get(w, ()):
            si, sj = i, j
            while si > 0 and sj > 0 and sentence[si - 1] == keys[sj - 1]:
                si, sj = si - 1, sj - 1
            if (si, sj) in seen:  # the run through an earlier anchor
                continue
            seen.add((si, sj))
            n = i - si + 1
            while si + n < len(sentence) and sj + n < len(keys) and sentence[si + n] == keys[sj + n]:
                n += 1
            out.append(Run(si, sj, n))
    return out


@dataclass(frozen=True, slots=True)
class Window:
    covered: float  # weight of the sentence's word types its runs cover
    longest: int  # words of its longest run
    copied: float  # the most weight one of its runs holds (copied word for word)
    first: int  # its first passage word
    last: int  # its last passage word (inclusive)


def best_window(sentence: Sequence[str], found: Sequence[Run], weight: Mapping[str, float],
                width: int) -> Window | None:
    """The window of at most ``width`` passage words whose runs (each holding a weighted word) cover the
    most weight of ``sentence``'s word types (ties: the shorter), trimmed to the runs it needs; None
    when there are no runs."""
    weighted = sorted(found, key=lambda r: r.j)
    types = [set(sentence[r.i:r.i + r.n]) for r in weighted]
    held = [sum(weight.get(w, 0.0) for w in t) for t in types]
    counts: Counter[str] = Counter()
    covered, left, best = 0.0, 0, None

    def drop(k: int) -> float:
        lost = 0.0
        for w in types[k]:
            counts[w] -= 1
            if counts[w] == 0:
                lost += weight.get(w, 0.0)
        return lost

    def needed(k: int) -> bool:
        return any(counts[w] == 1 and weight.get(w, 0.0) for w in types[k])

    for right, run in enumerate(weighted):
        for w in types[right]:
            counts[w] += 1
            if counts[w] == 1:
                covered += weight.get(w, 0.0)
        end = run.j + run.n - 1
        while left < right and (weighted[left].j + width <= end or not needed(left)):
            covered -= drop(left)  # too wide, or adds nothing the later runs do not
            left += 1
        window = weighted[left:right + 1]
        first = min(r.j for r in window)
        last = max(r.j + r.n - 1 for r in window)
        if best is None or (covered, first - last) > (best.covered, best.first - best.last):
            best = Window(covered, max(r.n for r in window), max(held[left:right + 1]), first, last)
    return best
