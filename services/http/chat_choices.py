"""``/v1/chat/completions`` with ``n > 1`` or ``logprobs``: every choice its own generator request (choices.py),
each choice's ``logprobs`` in OpenAI's chat shape (logprobs.py), in the JSON and in each SSE chunk.

``routes.Frontend.chat`` hands such a request here once it is checked; the rest (one choice, no
logprobs) stays on its own path. Each choice is translated by ``translate`` as a lone answer would be,
then re-indexed; usage counts the prompt once and sums the choices' completions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response

from lookahead_rag.services.common.telemetry.logs import request_context
from lookahead_rag.services.generator.domain import FinalInfo, TokenLogprob
from lookahead_rag.services.generator.prepared import PromptFacts
from lookahead_rag.services.http import choices, errors, translate
from lookahead_rag.services.http.logprobs import TokenPieces, chat_logprobs
from lookahead_rag.services.http.schema import ChatCompletionRequest
from lookahead_rag.services.http.streaming import (
    DONE,
    SSE_MEDIA_TYPE,
    ClosingStreamingResponse,
    json_reply,
    or_disconnect,
    sse,
)

if TYPE_CHECKING:
    from lookahead_rag.services.http.routes import Chunks, Frontend

Json = dict[str, Any]


def wants_choices(body: ChatCompletionRequest) -> bool:
    """Whether the request takes this path: several choices, or logprobs."""
    return (body.n or 1) != 1 or bool(body.logprobs) or bool(body.top_logprobs)


class ChoiceChunks:
    """One choice's stream translated: its chunks re-indexed, its pending logprobs on the next chunk with a choice."""

    def __init__(self, index: int, reply: translate.Reply, pieces: TokenPieces | None) -> None:
        self.index = index
        self.stream = translate.StreamTranslator(reply)
        self.pieces = pieces  # None: no logprobs asked
        self.pending: list[TokenLogprob] = []

    def objects(self, chunk: Any) -> list[Json]:
        if isinstance(chunk, FinalInfo):
            out = [o for o in self.stream.final(chunk) if o["choices"]]  # the summed usage comes once, at the end
        else:
            self.pending.extend(chunk.logprobs)
            out = self.stream.delta(chunk)
        for obj in out:
            for choice in obj["choices"]:
                choice["index"] = self.index
                if self.pieces is not None and self.pending:
                    choice["logprobs"] = chat_logprobs(self.pieces, self.pending)
                    self.pending = []
        return out


async def chat(front: Frontend, body: ChatCompletionRequest, request: Request, tenant: str,
               deadline: float | None, rid: str, headers: dict[str, str]) -> Response:
    """The response to ``body`` (checked already), its choices run concurrently."""
    n = choices.check_n(body.n, body.temperature, front.safe_stream(tenant, body.safe_stream))  # the tenant's too
    limits = front.generator.limits
    limits.check_messages("messages", len(body.messages), n)  # each choice renders them
    if body.logprobs:  # every choice's tokens, each with its alternatives: built, held and sent
        limits.check_logprob_entries(n, body.max_completion_tokens or body.max_tokens, body.top_logprobs or 0)
    reply = translate.Reply.of(rid, front.model, body)
    pieces = TokenPieces(front.generator.tokenizer) if body.logprobs else None
    facts: list[PromptFacts] = []
    seeds = choices.choice_seeds(body.seed, n)
    streams: list[Chunks] = [
        front.chunks(body.model_copy(update={"seed": seed}), tenant, deadline, rid if i == 0 else f"{rid}-{i}",
                     facts.append)
        for i, seed in enumerate(seeds)
    ]
    when = choices.loop_deadline(deadline)
    if not body.stream:
        got = await or_disconnect(request, choices.collect_all(streams, when, deadline))
        headers.update(translate.prompt_headers(facts[-1] if facts else None))
        return await json_reply(lambda: _whole(reply, got, pieces), front.generator.settings.stream_send_timeout_s,
                                headers)
    first = await or_disconnect(request, choices.firsts(streams, when))  # errors before it keep their status
    headers.update(translate.prompt_headers(facts[-1] if facts else None))
    per_choice = [ChoiceChunks(i, reply, pieces) for i in range(n)]
    events = _events(reply, per_choice, choices.merged(first, streams, when), deadline, (rid, tenant))
    return ClosingStreamingResponse(events, front.generator.settings.stream_send_timeout_s, media_type=SSE_MEDIA_TYPE,
                                    headers={**headers, "cache-control": "no-cache"})


def _whole(reply: translate.Reply, got: list[choices.Choice], pieces: TokenPieces | None) -> Json:
    """The whole response (not streamed): every choice, its logprobs when asked, the summed usage."""
    out = translate.completion(reply, got[0].final)
    out["choices"] = []
    for i, c in enumerate(got):
        choice = translate.completion(reply, c.final)["choices"][0]
        choice["index"] = i
        if pieces is not None:
            choice["logprobs"] = chat_logprobs(pieces, c.logprobs)
        out["choices"].append(choice)
    out["usage"] = translate.usage(*(c.final for c in got))
    return out


async def _events(reply: translate.Reply, per_choice: list[ChoiceChunks], chunks: AsyncIterator[tuple[int, Any]],
                  deadline: float | None, context: tuple[str, str]) -> AsyncIterator[bytes]:
    """The SSE body: every choice's chunks as they come, the summed usage (when asked), ``data: [DONE]``."""
    finals: list[FinalInfo] = []
    with request_context(*context):
        try:
            async for i, chunk in choices.checked(chunks, deadline, finals):
                for obj in per_choice[i].objects(chunk):
                    yield sse(obj)
            if reply.include_usage:
                yield sse({**reply.head("chat.completion.chunk"), "choices": [], "usage": translate.usage(*finals)})
            yield DONE
        except Exception as exc:
            yield sse(errors.http_error(exc)[1])
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


