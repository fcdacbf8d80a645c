"""Token logprobs (``TextDelta.logprobs``) in OpenAI's two shapes, built with the ``openai`` package's types.

    pieces = TokenPieces(tokenizer)
    chat_logprobs(pieces, logprobs)          # chat: {"content": [{token, logprob, bytes, top_logprobs}], ...}
    LegacyLogprobs(pieces).add(logprobs)     # completions: {tokens, token_logprobs, top_logprobs, text_offset}

A token's ``token`` is its text decoded alone; ``bytes`` are its raw UTF-8 bytes (a byte-level BPE piece
may hold part of a character: its bytes say which, where its text shows U+FFFD). The values are the
engine's (lookahead_core): the raw model distribution at each position, before temperature / top-p / top-k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from openai.types.completion_choice import Logprobs
from transformers.convert_slow_tokenizer import bytes_to_unicode

from lookahead_rag.services.generator.domain import TokenLogprob

Json = dict[str, Any]
BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}  # byte-level BPE's piece alphabet


class TokenPieces:
    """Each token's text and raw bytes, decoded once per token id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._seen: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(text, bytes) of ``token_id``."""
        if token_id not in self._seen:
            text = self.tokenizer.decode([token_id])
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in BYTE_OF_CHAR for c in piece):
                raw = [BYTE_OF_CHAR[c] for c in piece]  # byte-level BPE: the exact bytes, partial characters too
            else:
                raw = list(text.encode())
            self._seen[token_id] = (text, raw)
        return self._seen[token_id]

    def text(self, token_id: int) -> str:
        return self(token_id)[0]


def chat_logprobs(pieces: TokenPieces, logprobs: Sequence[TokenLogprob]) -> Json:
    """A chat choice's (or chunk's) ``logprobs``: one ``content`` entry per token."""
    content = []
    for lp in logprobs:
        text, raw = pieces(lp.token_id)
        top = [TopLogprob(token=pieces(t)[0], bytes=pieces(t)[1], logprob=v) for t, v in lp.top]
        content.append(ChatCompletionTokenLogprob(token=text, bytes=raw, logprob=lp.logprob, top_logprobs=top))
    return ChoiceLogprobs(content=content, refusal=None).model_dump(mode="json")


class LegacyLogprobs:
    """A completion choice's ``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset), built step by
    step: ``text_offset`` is each token's character offset in the choice's text, counted across the stream."""

    def __init__(self, pieces: TokenPieces, offset: int = 0) -> None:
        self.pieces = pieces
        self.offset = offset  # the next token's character offset

    def add(self, logprobs: Sequence[TokenLogprob]) -> Json:
        """The logprobs object of these tokens (the next ones of the choice)."""
        out = Logprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for lp in logprobs:
            text = self.pieces.text(lp.token_id)
            out.tokens.append(text)  # type: ignore[union-attr]
            out.token_logprobs.append(lp.logprob)  # type: ignore[union-attr]
            # a dict by token text: alternatives that decode alike keep the likelier (OpenAI's shape)
            top: dict[str, float] = {}
            for t, v in lp.top:
                top.setdefault(self.pieces.text(t), v)
            out.top_logprobs.append(top)  # type: ignore[union-attr]
            out.text_offset.append(self.offset)  # type: ignore[union-attr]
            self.offset += len(text)
        return out.model_dump(mode="json")
