"""A validated request on its way to decoding, and the documents its answer is grounded on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lookahead_core import DecodingConfig

from lookahead_rag.services.generator.domain import ChatMessage, DocumentChunk


@dataclass
class Prepared:
    """A validated request, ready to decode."""

    tenant: str
    question: str
    prompt_ids: list[int]
    references: list[list[int]]
    config: DecodingConfig
    request_id: str
    documents: tuple[DocumentChunk, ...] = ()
    documents_available: bool = True
    started: float = field(default_factory=time.perf_counter)
    prefix_epoch: int | None = None  # the tenant's prefix cache epoch before the prompt was built (forgets)
    history: tuple[ChatMessage, ...] = ()  # an answer's conversation before its question (AnswerQuery.history)
    history_turns_kept: int = 0  # the conversation's newest turns the prompt holds (the oldest are cut first)
    fill_context: bool = False  # max_new_tokens is the context's room once the prompt is built (within the limit)


@dataclass(frozen=True)
class PromptFacts:
    """What an answer's prompt came to, known before its first token (the OpenAI endpoint's headers)."""

    history_turns_kept: int  # the conversation's newest turns in the prompt
    max_new_tokens: int  # the most tokens the answer may take


def grounding_doc_ids(chunks: Sequence[DocumentChunk]) -> list[str]:
    """The documents an answer was grounded on: its prompt's chunks' doc ids, once each, in order."""
    return list(dict.fromkeys(chunk.doc_id for chunk in chunks if chunk.doc_id))
