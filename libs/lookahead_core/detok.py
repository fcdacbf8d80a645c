"""Incremental detokenization for streaming: whole characters only, text identical to a full decode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what a decode of an incomplete UTF-8 byte sequence ends with


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Each delta is decoded from a short window that starts a few tokens back (``prefix_offset``),
    so tokenizers that drop a word's leading space when decoding it alone still produce the right
    text; a window that ends in the middle of a multi-byte character is held back until it
    completes. The concatenation of all deltas plus ``flush()`` equals ``decode(all ids)``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens whose text has been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the newly completed text (may be empty)."""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            delta = after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever text is still held back (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]


class TextStreamer:
    """Detokenizes verified tokens for a stream and never emits text past a stop string.

    Text that could be the beginning of a stop string is held back until it is decided.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_strings: Sequence[str] = ()) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = [s for s in stop_strings if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1  # chars a stop could start in
        self.text = ""  # everything decoded so far
        self.sent = 0  # characters of ``text`` already returned
        self.stopped = False  # a stop string was seen: nothing more is emitted

    def push(self, new_ids: Sequence[int]) -> str:
        """Add verified tokens; return the text now safe to show."""
        if self.stopped:
            return ""
        self.text += self.detok.push(new_ids)
        if self._cut_at_stop():
            return self._take(len(self.text))
        safe = len(self.text) - self._hold if self.stops else len(self.text)
        return self._take(safe)

    def finish(self) -> str:
        """The rest of the text, cut before the first stop string."""
        if not self.stopped:
            self.text += self.detok.flush()
            self._cut_at_stop()
        return self._take(len(self.text))

    def _cut_at_stop(self) -> bool:
        """Cut ``text`` before the first complete stop string; True once one was found."""
        cuts = [self.text.find(s) for s in self.stops if s in self.text]
        if cuts:
            self.text = self.text[: min(cuts)]
            self.stopped = True
        return self.stopped

    def _take(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent : upto]
        self.sent = upto
        return out
