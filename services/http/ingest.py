"""``POST /v1/documents``: a tenant's documents into its index, for the chat page's upload (and any client).

    POST /v1/documents   {"documents": [{"id": "notes.md", "title": "Notes", "text": "...", "source": "notes.md"}]}
    -> 200 {"object": "ingest", "documents": 1, "unchanged": 0, "chunks": 3, "total_chunks": 42}

A thin door to the retriever's own Ingest (the same checks, quota and document events as ``lookahead-rag
ingest``): the tenant is the caller's (``Frontend.tenant_of``), the route needs the ``write`` scope
(``services.common.auth.scopes``), and the caller's key is sent on to the retriever, which checks it again.
``Frontend.ingest`` is how this process reaches a retriever (``services.app`` wires it); without one the
route is a 503. Errors have the endpoint's shape and status (``services.http.errors``); a title or source
past its ``[limits]`` bound is a 400 here, before the body is sent on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from lookahead_rag.services.common.auth.callers import AUTHORIZATION, bearer_token
from lookahead_rag.services.common.errors import FailedPrecondition
from lookahead_rag.services.http import errors

if TYPE_CHECKING:
    from lookahead_rag.services.http.routes import Frontend


class DocumentIn(BaseModel):
    """One document, as the retriever's ``Document`` (title: its id when empty; source: where it came from)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    text: str
    title: str = ""
    source: str = ""


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)


@dataclass(frozen=True)
class IngestCounts:
    """What the retriever's Ingest replied: documents taken in (changed or new), chunks added, the tenant's total."""

    documents: int
    chunks: int
    total_chunks: int


# (tenant, documents, the caller's API key or None) -> the counts; raises ServiceErrors as the retriever's Ingest
Ingest = Callable[[str, Sequence[DocumentIn], str | None], Awaitable[IngestCounts]]


async def ingest(front: Frontend, body: IngestRequest, request: Request) -> Response:
    try:
        tenant, _ = front.admitted(request, "")
        if front.ingest is None:
            raise FailedPrecondition("this endpoint reaches no retriever: ingest with `lookahead-rag ingest`")
        for n, doc in enumerate(body.documents):  # [limits]: refused here, before the text travels on
            front.generator.limits.check_document_fields(f"documents[{n}]", doc.title, doc.source)
        key = bearer_token(request.headers.get(AUTHORIZATION)) if front.auth is not None else None
        counts = await front.ingest(tenant, body.documents, key)
    except Exception as exc:
        return errors.error_response(exc, fields=IngestRequest.model_fields)
    return JSONResponse({"object": "ingest", "documents": counts.documents,
                         "unchanged": len(body.documents) - counts.documents, "chunks": counts.chunks,
                         "total_chunks": counts.total_chunks})
