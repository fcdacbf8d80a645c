"""A validated request on its way to decoding, and the documents its answer is grounded on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lookahead_core import DecodingConfig

from lookahead_rag.services.generator.domain import DocumentChunk


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


def grounding_doc_ids(chunks: Sequence[DocumentChunk]) -> list[str]:
    """The documents an answer was grounded on: its prompt's chunks' doc ids, once each, in order."""
    return list(dict.fromkeys(chunk.doc_id for chunk in chunks if chunk.doc_id))
