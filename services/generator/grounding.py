"""An answer's prompt: the retriever's grounded prompt, or, when the retriever is down or late, the
conversation alone in the chat template (its newest turns that fit); then the answer's room in the
context (the OpenAI endpoint's max_tokens rule, ``Prepared.fill_context``).

    if not await retrieve(retriever, tokenizer_id, prep, k, m, timeout_s):   # the retriever could not answer
        fallback(tokenizer, prep, budget)                  # no documents: prep.documents_available is False
    fill_room(prep, context_tokens, limits)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lookahead_rag.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from lookahead_rag.services.common.rules.context import context_room
from lookahead_rag.services.common.rules.conversation import newest_that_fit, split_turns
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.clients import RetrieverClient
from lookahead_rag.services.generator.domain import DocumentChunk, GenerationParams
from lookahead_rag.services.generator.prepared import Prepared
from lookahead_rag.services.generator.prompt_ids import chat_ids
from lookahead_rag.services.retriever.prompt import sanitize

if TYPE_CHECKING:
    from lookahead_rag.services.retriever.documents import ScoredChunk

log = logging.getLogger(__name__)

SYSTEM_SEP = "\n\n"  # between the conversation's system texts in the fallback's one system message


async def retrieve(retriever: RetrieverClient | None, tokenizer_id: str, prep: Prepared, k: int, m: int,
                   timeout_s: float) -> bool:
    """``prep``'s grounded prompt and documents from ``retriever``; False (logged) when there is none, or it
    fails or is late. The caller's bad input and set-up errors are raised."""
    if retriever is None:
        return False
    try:
        resp = await retriever.retrieve(prep.tenant, prep.question, k, m, prep.config.max_new_tokens, tokenizer_id,
                                        prep.history, timeout_s)
        if resp.unknown_tenant and not resp.chunks and not resp.sessions:
            raise NotFound(f"unknown tenant {prep.tenant!r}: no documents were ingested for it")
        if resp.tokenizer_id and resp.tokenizer_id != tokenizer_id:  # a retriever that skips the check
            raise FailedPrecondition(f"the retriever's tokenizer {resp.tokenizer_id} is not the generator's "
                                     f"{tokenizer_id}: set the same [model] name for both services")
    except (InvalidArgument, NotFound, FailedPrecondition):
        raise  # the caller's input (a prompt that cannot fit, a tenant never ingested) or a set-up error
    except (Exception, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise
        log.warning("retriever unavailable (%s); answering without documents", type(exc).__name__)
        return False
    prep.prompt_ids = list(resp.prompt_ids)
    prep.documents = documents_of(resp.chunks)
    prep.history_turns_kept = resp.history_turns_kept
    return True


def documents_of(chunks: Sequence[ScoredChunk]) -> tuple[DocumentChunk, ...]:
    """The retriever's chunks of a prompt, as the documents its answer is grounded on."""
    return tuple(DocumentChunk(c.chunk.doc_id, c.chunk.chunk_id, c.chunk.title, c.chunk.source, c.chunk.text, c.score)
                 for c in chunks)


def fallback(tokenizer: Any, prep: Prepared, budget: int | None) -> None:
    """``prep``'s prompt without documents: the conversation's system texts, its newest turns within
    ``budget`` tokens (None: all), then the question, in the chat template; special tokens in the
    caller's text defused as the retriever's prompt does (``retriever.prompt.sanitize``)."""
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if len(t) > 1]
    system, turns = split_turns(prep.history)
    head = [{"role": "system", "content": sanitize(SYSTEM_SEP.join(system), specials)}] if system else []
    question = [{"role": "user", "content": sanitize(prep.question, specials)}]

    def ids(n: int) -> list[int]:
        shown = [{"role": role, "content": sanitize(text, specials)}
                 for turn in turns[len(turns) - n:] for role, text in turn]
        return chat_ids(tokenizer, [*head, *shown, *question])

    kept = newest_that_fit(lambda n: budget is None or len(ids(n)) <= budget, len(turns))
    prep.prompt_ids, prep.history_turns_kept = ids(kept), kept
    prep.documents_available = False


def clamped(params: GenerationParams, limits: RequestLimits, up_to_context: bool) -> GenerationParams:
    """The OpenAI endpoint's rule (``up_to_context``): max_new_tokens over ``[limits] max_new_tokens`` is
    clamped to it rather than refused (0 stays 0: ``fill_room`` fills it once the prompt is known)."""
    if not up_to_context:
        return params
    return replace(params, max_new_tokens=min(params.max_new_tokens, limits.max_new_tokens))


def fill_room(prep: Prepared, context_tokens: int, limits: RequestLimits) -> None:
    """With ``prep.fill_context``: the answer may take the context's room after the prompt (all of
    ``[limits] max_new_tokens`` when the context is unknown), within that limit; a prompt that leaves
    no room keeps its config, and the fit check refuses it."""
    if not prep.fill_context:
        return
    room = context_room(context_tokens, len(prep.prompt_ids))
    room = limits.max_new_tokens if room is None else room
    if room >= 1:
        prep.config = replace(prep.config, max_new_tokens=min(room, limits.max_new_tokens))
