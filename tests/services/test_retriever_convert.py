"""A Retrieve over the wire reads back as the core returned it (what the generator's gRPC client hands on)."""

from __future__ import annotations

from lookahead_rag.services.retriever.convert import retrieve_response, retrieve_result
from lookahead_rag.services.retriever.core import RetrieveResult
from lookahead_rag.services.retriever.documents import ChunkRecord, ScoredChunk
from lookahead_rag.services.retriever.sessions import ScoredSession, SessionRecord


def test_a_retrieve_result_survives_the_wire() -> None:
    chunk = ScoredChunk(ChunkRecord("d#0", "d", "Title", "text", "src", 0, 4), 0.5)
    session = ScoredSession(SessionRecord("e1", "q?", "a.", created_unix_ms=0), 0.25)
    sent = RetrieveResult([chunk], [session], "prompt", [1, 2, 3], "tok", 1.5, 0, ["a note"], True, 2)
    assert retrieve_result(retrieve_response(sent)) == sent
