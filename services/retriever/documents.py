"""Documents as ingested and the chunks the index holds (with source and character offsets)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from lookahead_rag.services.retriever.chunking import chunk_spans

CHUNK_ID_SEP = "#"  # chunk id = "<doc id>#<n>"


@dataclass(frozen=True, slots=True)
class Document:
    id: str  # unique per tenant
    title: str
    text: str
    source: str = ""  # file path / URL it came from

    def digest(self) -> str:
        """Content hash: re-ingesting an unchanged document is a no-op."""
        payload = "\x00".join((self.title, self.text, self.source)).encode()
        return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    chunk_id: str
    doc_id: str
    title: str
    text: str  # == document.text[start:end]
    source: str
    start: int
    end: int

    def number(self) -> int:
        """The chunk's position in its document: the n of ``<doc id>#<n>`` (doc ids may hold ``#`` too)."""
        return int(self.chunk_id.rpartition(CHUNK_ID_SEP)[2])

    def embedding_text(self) -> str:
        """What gets embedded: the title gives short chunks their context."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkRecord:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class ScoredChunk:
    chunk: ChunkRecord
    score: float  # inner product of normalized embeddings (cosine)


def make_chunks(doc: Document, chunk_chars: int, overlap: int) -> list[ChunkRecord]:
    """The document's chunks in order, ids ``<doc id>#0``, ``#1``, ..."""
    spans = chunk_spans(doc.text, chunk_chars, overlap)
    return [
        ChunkRecord(
            chunk_id=f"{doc.id}{CHUNK_ID_SEP}{n}",
            doc_id=doc.id,
            title=doc.title,
            text=span.of(doc.text),
            source=doc.source,
            start=span.start,
            end=span.end,
        )
        for n, span in enumerate(spans)
    ]
