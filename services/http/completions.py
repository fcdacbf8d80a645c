"""``POST /v1/completions``: OpenAI's legacy completions over the generator's ``generate`` (no retrieval).

The prompt is decoded as given: text (no chat template) or token ids of the served model. ``n``
choices run concurrently (choices.py); ``logprobs`` (an int, 0..20) gives each token's logprob and
that many alternatives in the legacy shape (logprobs.py). Refused with a one-line 400: ``suffix``,
``echo``, ``best_of`` other than n, a batch of several prompts, and the penalties and ``logit_bias``
we cannot honour. Extensions as on chat: ``mode``, ``top_k``, ``min_p``, ``repetition_penalty``,
``return_token_ids``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response
from lookahead_core.config import MAX_TOP_LOGPROBS
from openai.types import Completion, CompletionChoice, CompletionUsage
from pydantic import BaseModel, ConfigDict

from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER, request_context
from lookahead_rag.services.generator.domain import FinalInfo, GenerateQuery, GenerationParams, PromptIds, TextDelta
from lookahead_rag.services.http import choices, errors, translate
from lookahead_rag.services.http import streaming as sse_io  # one name for the SSE helpers
from lookahead_rag.services.http.errors import InvalidParam
from lookahead_rag.services.http.logprobs import LegacyLogprobs, TokenPieces
from lookahead_rag.services.http.schema import StreamOptions

if TYPE_CHECKING:
    from lookahead_rag.services.http.routes import Frontend

Json = dict[str, Any]
OBJECT = "text_completion"


class CompletionRequest(BaseModel):
    """OpenAI's completion request (the fields that matter here) and our extension fields."""

    model_config = ConfigDict(extra="allow")

    model: str = ""  # empty: the served model
    prompt: str | list[int] | list[str] | list[list[int]]  # text, token ids, or a batch of one of them
    max_tokens: int | None = None  # omitted: the server's default ([limits] default_max_new_tokens)
    temperature: float | None = None  # omitted: greedy
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None  # choices (> 1 needs temperature > 0)
    logprobs: int | None = None  # 0..20: each token's logprob and this many alternatives
    # OpenAI fields we refuse unless they ask for the default
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    # extensions (docs/HTTP.md)
    mode: str | None = None  # the draft mode (GenerationParams.mode); omitted: the server's
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    return_token_ids: bool = False  # add prompt_token_ids and the choices' token_ids


def _refused(body: CompletionRequest) -> InvalidParam | None:
    """The first field asking for something we cannot do."""
    if body.suffix:
        return InvalidParam("suffix", "suffix is not supported (no fill-in-the-middle)")
    if body.echo:
        return InvalidParam("echo", "echo is not supported (the prompt's logprobs are not computed)")
    if body.best_of not in (None, 1, body.n):
        return InvalidParam("best_of", f"best_of={body.best_of} is not supported (only best_of = n)")
    if body.frequency_penalty or body.presence_penalty:
        name = "frequency_penalty" if body.frequency_penalty else "presence_penalty"
        return InvalidParam(name, f"{name} is not supported (use repetition_penalty)")
    if body.logit_bias:
        return InvalidParam("logit_bias", "logit_bias is not supported")
    return None


def _prompt(body: CompletionRequest) -> str | PromptIds:
    """The one prompt: text, or token ids (a batch of one is unwrapped; several are refused)."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise InvalidParam("prompt", f"a batch of {len(prompt)} prompts: send one prompt per request")
        prompt = prompt[0]  # type: ignore[assignment]
    if isinstance(prompt, list):
        if not prompt:
            raise InvalidParam("prompt", "the prompt is empty")
        return PromptIds(tuple(prompt))  # type: ignore[arg-type]
    return prompt  # type: ignore[return-value]


def _logprobs(body: CompletionRequest) -> tuple[bool, int]:
    """(logprobs asked, alternatives per token) from the legacy int."""
    if body.logprobs is None:
        return False, 0
    if not 0 <= body.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidParam("logprobs", f"logprobs={body.logprobs} is out of range (0..{MAX_TOP_LOGPROBS})")
    return True, body.logprobs


def generate_query(body: CompletionRequest, tenant: str, seed: int | None) -> GenerateQuery:
    """One choice's query: the prompt as given, no retrieval (as chat's ``"rag": false``)."""
    if body.max_tokens is not None and body.max_tokens < 1:
        raise InvalidParam("max_tokens", f"max_tokens must be at least 1, got {body.max_tokens}")
    if body.seed is not None and not 0 <= body.seed <= translate.UINT64_MAX:
        raise InvalidParam("seed", f"seed={body.seed} is out of range (0..{translate.UINT64_MAX})")
    if body.top_k is not None and not 0 <= body.top_k <= translate.UINT32_MAX:
        raise InvalidParam("top_k", f"top_k={body.top_k} is out of range (0..{translate.UINT32_MAX})")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    logprobs, top = _logprobs(body)
    params = GenerationParams(
        max_new_tokens=min(body.max_tokens or 0, translate.UINT32_MAX), stop=stop,
        temperature=body.temperature or 0.0, top_p=body.top_p or 0.0, top_k=body.top_k or 0, min_p=body.min_p or 0.0,
        repetition_penalty=body.repetition_penalty or 0.0, seed=seed,
    )
    return GenerateQuery(tenant, _prompt(body), params=choices.extended(params, body.mode, logprobs, top),
                         up_to_context=True)  # max_tokens omitted: up to the context; over the limit: clamped


# ---- response -------------------------------------------------------------------------------------
class Shape:
    """What every object of one response shares, and each choice's logprobs so far."""

    def __init__(self, rid: str, model: str, created: int, body: CompletionRequest, pieces: TokenPieces | None,
                 n: int) -> None:
        self.head: Json = {"id": f"cmpl-{rid}", "object": OBJECT, "created": created, "model": model}
        self.token_ids = body.return_token_ids
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.logprobs = [LegacyLogprobs(pieces) for _ in range(n)] if pieces is not None else None

    def choice(self, index: int, text: str, logprobs: Any, finish: str | None, ids: list[int] | None) -> Json:
        lp = self.logprobs[index].add(logprobs) if self.logprobs is not None else None
        choice = CompletionChoice.model_construct(index=index, text=text, logprobs=lp, finish_reason=finish)
        out = choice.model_dump(mode="json")
        if self.token_ids and ids is not None:
            out["token_ids"] = ids
        return out

    def usage(self, finals: list[FinalInfo]) -> Json:
        return CompletionUsage(**translate.usage(*finals)).model_dump(mode="json", exclude_none=True)

    def whole(self, got: list[choices.Choice]) -> Json:
        """The whole response (not streamed)."""
        listed = [self.choice(i, c.final.answer_text, c.logprobs, translate.finish_reason(c.final.stats.finish_reason),
                              list(c.final.output_ids)) for i, c in enumerate(got)]
        out = Completion.model_construct(**self.head, choices=[]).model_dump(mode="json", exclude_none=True)
        out.update(choices=listed, usage=self.usage([c.final for c in got]))
        if self.token_ids:
            out["prompt_token_ids"] = list(got[0].final.prompt_ids)
        return out

    def chunk(self, choice: Json) -> Json:
        return {**self.head, "choices": [choice]}

    def delta_event(self, index: int, delta: TextDelta) -> bytes:
        """One step's event; a safe stream's padded to the one size every delta event of the stream has."""
        event = self.chunk(self.choice(index, delta.text, delta.logprobs, None, list(delta.token_ids)))
        if not delta.safe_bytes:
            return sse_io.sse(event)
        largest = self.chunk(self.choice(index, "", (), None, []))  # every field a delta's event can have, empty
        return sse_io.padded_sse(event, sse_io.safe_event_bytes(largest, delta.safe_bytes))


async def complete(front: Frontend, body: CompletionRequest, request: Request) -> Response:
    """The endpoint: checks, then the choices' generator requests, as JSON or SSE."""
    headers: dict[str, str] = {}
    try:
        tenant, deadline = front.admitted(request, body.model)
        refused = _refused(body)
        if refused is not None:
            raise refused
        n = choices.check_n(body.n, body.temperature, front.safe_stream(tenant, False))  # a safe tenant: one choice
        if body.logprobs is not None:  # every choice's tokens, each with its alternatives: built, held and sent
            front.generator.limits.check_logprob_entries(n, body.max_tokens, _logprobs(body)[1])
        with request_context(request.headers.get(REQUEST_ID_HEADER), tenant) as rid:
            headers[REQUEST_ID_HEADER] = rid
            queries = [generate_query(body, tenant, s) for s in choices.choice_seeds(body.seed, n)]
            streams = [front.generator.generate(q, deadline, rid if i == 0 else f"{rid}-{i}")
                       for i, q in enumerate(queries)]
            pieces = TokenPieces(front.generator.tokenizer) if body.logprobs is not None else None
            shape = Shape(rid, front.model, int(time.time()), body, pieces, n)
            when = choices.loop_deadline(deadline)
            if not body.stream:
                got = await sse_io.or_disconnect(request, choices.collect_all(streams, when, deadline))
                return await sse_io.json_reply(lambda: shape.whole(got),
                                               front.generator.settings.stream_send_timeout_s, headers)
            first = await sse_io.or_disconnect(request, choices.firsts(streams, when))
            events = _events(shape, choices.merged(first, streams, when), deadline, (rid, tenant))
            return sse_io.ClosingStreamingResponse(
                events, front.generator.settings.stream_send_timeout_s, media_type=sse_io.SSE_MEDIA_TYPE,
                headers={**headers, "cache-control": "no-cache"})
    except sse_io.ClientDisconnected:
        return Response(status_code=errors.CLIENT_CLOSED)
    except Exception as exc:
        return errors.error_response(exc, headers, CompletionRequest.model_fields)


async def _events(shape: Shape, chunks: AsyncIterator[tuple[int, Any]], deadline: float | None,
                  context: tuple[str, str]) -> AsyncIterator[bytes]:
    """The SSE body: a chunk per step of each choice, its last with the finish_reason, the usage (when
    asked), ``data: [DONE]``; an error after the status line is one ``data: {"error": ...}`` event."""
    finals: list[FinalInfo] = []
    with request_context(*context):
        try:
            async for i, chunk in choices.checked(chunks, deadline, finals):
                if isinstance(chunk, FinalInfo):
                    last = shape.choice(i, "", (), translate.finish_reason(chunk.stats.finish_reason), None)
                    if shape.token_ids:
                        last["prompt_token_ids"] = list(chunk.prompt_ids)
                    yield sse_io.sse(shape.chunk(last))
                elif chunk.text or chunk.logprobs or (shape.token_ids and chunk.token_ids) or chunk.safe_bytes:
                    yield shape.delta_event(i, chunk)  # a safe stream's delta always makes one: a missing one tells
            if shape.include_usage:
                yield sse_io.sse({**shape.head, "choices": [], "usage": shape.usage(finals)})
            yield sse_io.DONE
        except Exception as exc:
            yield sse_io.sse(errors.http_error(exc)[1])
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
