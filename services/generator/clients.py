"""What the generator needs from the retriever and the draft cache (each ships its own clients).

The retriever's and the draft cache's packages provide a gRPC client and an in-process client
each (``lookahead_rag.services.retriever.client``, ``lookahead_rag.services.draftcache.client``); both return the
same domain values (the retriever core's ``RetrieveResult``, the draft cache's ``Continuation`` list; the
gRPC ones convert the wire in their service's ``convert.py``), so the engine holds no protobuf and does
not care which client it has. A failure or a deadline is raised to the engine, which then answers without
that part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from lookahead_rag.services.common.rules.conversation import Message

if TYPE_CHECKING:  # types only: the generator never loads the other services' code for them
    from lookahead_rag.services.draftcache.fetch import Continuation
    from lookahead_rag.services.retriever.core import RetrieveResult


class RetrieverClient(Protocol):
    async def retrieve(
        self, tenant: str, question: str, k: int, m: int, max_new_tokens: int, tokenizer_id: str,
        history: Sequence[Message], timeout_s: float,
    ) -> RetrieveResult: ...

    async def served_model(self, timeout_s: float) -> tuple[str, str]: ...


class DraftCacheClient(Protocol):
    async def fetch(
        self, tenant: str, tokenizer_id: str, prompt_ids: Sequence[int], reference_ids: Sequence[int],
        budget: int, timeout_s: float,
    ) -> list[Continuation]: ...
