"""Split long documents into overlapping chunks that end on paragraph or sentence boundaries.

Every chunk is an exact slice ``text[start:end]`` of its document, so offsets point back into the
source. A chunk ends at the last paragraph break in the back half of its window, else the last
sentence end, else the last line break or space, else exactly at ``chunk_chars``; the next chunk
starts about ``overlap`` characters earlier, moved forward to the next sentence or word start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Break points, best first: where a chunk may end (the match's end is the cut).
_ENDINGS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\n\s*\n"),  # paragraph
    re.compile(r"[.!?][\"')\]]?\s"),  # sentence
    re.compile(r"\n"),  # line
    re.compile(r"\s"),  # word
)
MIN_FILL = 0.5  # a cut must keep at least this fraction of the window, else a worse kind of break is tried


@dataclass(frozen=True, slots=True)
class Span:
    start: int  # character offset of the first character
    end: int  # offset one past the last character

    def of(self, text: str) -> str:
        return text[self.start : self.end]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut(text: str, start: int, limit: int) -> int:
    """The end of a chunk starting at ``start`` that may reach ``limit`` at most."""
    lowest = start + int((limit - start) * MIN_FILL)
    window = text[lowest:limit]
    for pattern in _ENDINGS:
        last = None
        for last in pattern.finditer(window):  # noqa: B007 - we want the last match
            pass
        if last is not None:
            return lowest + last.end()
    return limit


def _next_start(text: str, prev_start: int, content_end: int, overlap: int) -> int:
    """Start of the next chunk: ``overlap`` characters back from the previous chunk's last character,
    moved to the first sentence start (else line or word start) that still lies inside that chunk."""
    back = max(content_end - overlap, prev_start + 1)
    if back >= content_end:
        return content_end
    window = text[back:content_end]
    for pattern in _ENDINGS[1:]:
        for match in pattern.finditer(window):
            if match.end() < len(window):  # a start inside the previous chunk, so they overlap
                return back + match.end()
    return back


def chunk_spans(text: str, chunk_chars: int, overlap: int) -> list[Span]:
    """Non-empty, whitespace-trimmed spans covering ``text``; neighbours overlap by about ``overlap``."""
    if overlap >= chunk_chars:
        raise ValueError(f"overlap ({overlap}) must be below chunk_chars ({chunk_chars})")
    spans: list[Span] = []
    start = 0
    length = len(text)
    while start < length:
        limit = start + chunk_chars
        end = length if limit >= length else _cut(text, start, limit)
        s, e = _strip(text, start, end)
        if e > s:
            spans.append(Span(s, e))
        if end >= length:
            break
        start = max(_next_start(text, start, e, overlap), start + 1) if overlap else end
    return spans
