"""bench hostile's victim: bench serve's closed-loop clients (bench/serve_client.py) through a stub that sends
the victim's key on every call and notes, per answer, the documents its final message says it was grounded on.

    stub = KeyedStub(GeneratorStub(channel), key)
    records, wall = await closed_loop(stub, questions, 2, "", 64, 600.0, "victim")
    kept = documents_kept(records, stub.documents)     # answers that kept their documents, and those that did not
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lookahead_rag.bench.serve_stats import RequestRecord
from lookahead_rag.services.common.auth.callers import bearer_metadata
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER


def request_id_of(metadata: Sequence[tuple[str, str]]) -> str:
    """The request id serve_client sends with each call ("" without one)."""
    return next((value for name, value in metadata if name == REQUEST_ID_HEADER), "")


@dataclass
class KeyedStub:
    """A GeneratorStub's Answer with ``key`` added to every call's metadata; ``documents[request id]`` is the
    number of documents the answer's FinalInfo carries (set once its final message arrived)."""

    inner: Any  # the GeneratorStub
    key: str  # the victim's API key
    documents: dict[str, int] = field(default_factory=dict)

    def Answer(self, request: Any, timeout: float, metadata: Sequence[tuple[str, str]]) -> AsyncIterator[Any]:
        return self._answer(request, timeout, (*metadata, *bearer_metadata(self.key)))

    async def _answer(self, request: Any, timeout: float, metadata: tuple[tuple[str, str], ...]) -> AsyncIterator[Any]:
        rid = request_id_of(metadata)
        async for chunk in self.inner.Answer(request, timeout=timeout, metadata=metadata):
            if chunk.HasField("final"):
                self.documents[rid] = len(chunk.final.documents)
            yield chunk


def documents_kept(records: Sequence[RequestRecord], documents: Mapping[str, int]) -> dict[str, int]:
    """Completed answers grounded on at least one document ("kept") and those grounded on none ("lost": the
    generator's no-documents fallback, e.g. a retrieval past its deadline)."""
    done = [r for r in records if r.completed]
    kept = sum(documents.get(r.request_id, 0) > 0 for r in done)
    return {"kept": kept, "lost": len(done) - kept}
