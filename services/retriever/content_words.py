"""Which words of an answer carry what it claims: its content words, and how much each counts.

Words are compared by a crude stem (``stem``: "attacked", "attacks" and "attack" are one word).
Function words ("the", "of", "was") and a reader's words about the passages ("the document states")
count nothing; negations ("not", "no", "never") are content, since
they flip a claim. A content word the question already holds counts ``QUESTION_WEIGHT``: an answer that
echoes the question ("The first ruler of Normandy was Rollo.") is supported by the passage holding
its new words ("Rollo"), not by one that merely repeats the question's.

    content_weights(["the", "first", "ruler", "was", "rollo"], {"first", "ruler"})
    -> {"first": 0.25, "ruler": 0.25, "rollo": 1.0}
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

QUESTION_WEIGHT = 0.25  # a content word the question holds: weak evidence that a passage supports the answer
FUNCTION_WORDS = frozenset((
    "a", "an", "the", "and", "or", "but", "if", "then", "so", "than", "as", "of", "in", "on", "at", "to", "from",
    "by", "for", "with", "about", "into", "onto", "over", "under", "between", "through", "during", "before",
    "after", "above", "below", "up", "down", "out", "off", "again", "further", "once", "here", "there", "when",
    "where", "why", "how", "what", "which", "who", "whom", "whose", "this", "that", "these", "those", "is", "are",
    "was", "were", "be", "been", "being", "am", "have", "has", "had", "having", "do", "does", "did", "doing", "i",
    "me", "my", "we", "our", "you", "your", "he", "him", "his", "she", "her", "it", "its", "they", "them", "their",
    "can", "could", "would", "should", "will", "shall", "may", "might", "must", "s", "t", "d", "ll", "re", "ve",
    "also", "just", "very", "too", "only", "own", "same", "such", "other", "some", "any", "each", "both", "all",
    "most", "more", "many", "much", "one", "ones", "document", "documents", "passage", "passages", "text",
    "context", "according", "answer", "mentioned", "mentions", "says", "states"
))
SUFFIXES = ("ing", "ed", "s")  # stripped, the first that fits, from a word longer than MIN_STEMMED
MIN_STEMMED = 4
MIN_STEM = 3  # letters a stem keeps at least
STEM_CACHE = 1 << 16  # words whose stems are kept


@functools.lru_cache(maxsize=STEM_CACHE)
def stem(word: str) -> str:
    """``word`` (lowercased) without one inflection suffix; function words and short words as they are."""
    if len(word) <= MIN_STEMMED or word in FUNCTION_WORDS or word.endswith("ss"):
        return word
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= MIN_STEM:
            return word[:-len(suffix)]
    return word


def content_weights(sentence: Sequence[str], question: Collection[str] = ()) -> dict[str, float]:
    """Each content word type of ``sentence`` (stemmed words, as ``question``'s) and its weight; a sentence of
    function words only counts every word (it claims what it says)."""
    content = [w for w in sentence if w not in FUNCTION_WORDS] or list(sentence)
    return {w: QUESTION_WEIGHT if w in question else 1.0 for w in content}
