"""Incremental detokenization for streaming: whole characters only, text identical to a full decode."""

from __future__ import annotations

from collections.abc import Sequence

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
