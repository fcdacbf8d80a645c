"""Whether an answer's passages support it, checked off the event loop, and what its caller is given.

With ``[generator] ungrounded = "flag"`` (the default) every answer to a question is returned as made and
marked ``grounded``; with ``"abstain"`` an answer the passages do not support is replaced by the
configured ``refusal``. A streamed answer is not held back: the check needs the answer's last word, and
holding every answer back until then would cost each stream its first token (the TTFT target) for the
few that fail it. So it streams as usual and its final message retracts it (``retracted``, the refusal
as ``answer_text``, no citations); the chat page replaces the text it showed with the refusal. A raw
``Generate`` (no question, no passages) is not checked (``grounded`` None).

The check (``retriever.grounded.ground``: pure Python, a few ms for a 512-token answer at k=16) runs on
a worker thread of its own, never on the event loop that carries every stream, and one answer at a time,
so it never holds the GIL against the loop from more than one thread.

    check = AnswerCheck("abstain", "The documents do not say.")
    v = await check(answer, prep.documents, prep.question)   # Verdict(answer_text, citations, grounded, retracted)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from lookahead_rag.services.generator.domain import DocumentChunk
from lookahead_rag.services.retriever.citations import Citation, CitedPassage
from lookahead_rag.services.retriever.grounded import ground

CHECK_WORKERS = 1  # one check at a time: the loop competes for the GIL with one thread, not with n
Ungrounded = Literal["flag", "abstain"]


@dataclass(frozen=True, slots=True)
class Verdict:
    answer_text: str  # what the caller is given: the answer, or the refusal when retracted
    citations: tuple[Citation, ...]  # the passages supporting it (none when retracted)
    grounded: bool | None  # whether they support it; None: not checked (no question)
    retracted: bool = False  # abstain: the answer was replaced by the refusal


def verdict(answer: str, documents: Sequence[DocumentChunk], question: str, mode: Ungrounded,
            refusal: str) -> Verdict:
    """``answer``'s verdict under ``mode``: its citations and whether ``documents`` support it (pure)."""
    if not question:
        return Verdict(answer, (), None)
    g = ground(answer, [CitedPassage(d.doc_id, d.chunk_id, d.text) for d in documents], question, refusal)
    if not g.grounded and mode == "abstain":
        return Verdict(refusal, (), False, retracted=True)
    return Verdict(answer, g.citations, g.grounded)


class AnswerCheck:
    """``verdict`` on a worker thread of its own (``[generator] ungrounded`` and ``refusal``)."""

    def __init__(self, mode: Ungrounded, refusal: str) -> None:
        self.mode, self.refusal = mode, refusal
        self.pool = ThreadPoolExecutor(CHECK_WORKERS, thread_name_prefix="answer-check")

    async def __call__(self, answer: str, documents: Sequence[DocumentChunk], question: str) -> Verdict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, verdict, answer, documents, question, self.mode, self.refusal)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
