"""OpenAI JSON <-> the generator's domain types (services.generator.domain): no decoding here.

    query = answer_query(body, tenant)                  # ChatCompletionRequest -> AnswerQuery
    reply = Reply.of(request_id, model, body)
    completion(reply, final)                           # FinalInfo -> chat.completion
    stream = StreamTranslator(reply)
    stream.delta(delta) / stream.final(final)          # -> chat.completion.chunk objects

Values are checked by the generator exactly as for gRPC; here only what the gRPC API could not carry
either (a negative count, one past uint32 / uint64, a missing question) or what we cannot honour
(n > 1, logprobs, tools) is refused, each with a one-line InvalidArgument. One rule differs: in RAG
mode ``max_tokens`` omitted is up to the context and one over the limit is clamped
(``AnswerQuery.up_to_context``); the usage then says what was allowed (``max_tokens_allowed``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.generator.domain import (
    AnswerQuery,
    ChatMessage,
    FinalInfo,
    GenerateQuery,
    GenerationParams,
    TextDelta,
)
from lookahead_rag.services.generator.prepared import PromptFacts
from lookahead_rag.services.http.schema import ChatCompletionRequest, Message

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
SCORE_DIGITS = 6  # retrieval scores are float32: more digits are noise
STAT_DIGITS = 4  # seconds and tokens per step in the decoding extension
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # generator -> OpenAI (others as they are)
ROLES = {"developer": "system"}  # OpenAI's newer role names -> the chat template's
HISTORY_TURNS_HEADER = "x-lookahead-history-turns-kept"  # RAG: the conversation's turns kept in the prompt
Json = dict[str, Any]


# ---- request --------------------------------------------------------------------------------------
def _refused(body: ChatCompletionRequest) -> str | None:
    """The first field asking for something the generator cannot do, as a one-line reason."""
    if body.tools or body.functions:
        return "tools and function calling are not supported"
    if body.response_format and body.response_format.get("type", "text") != "text":
        return f"response_format {body.response_format.get('type')!r} is not supported (only text)"
    if body.frequency_penalty or body.presence_penalty:
        return "frequency_penalty and presence_penalty are not supported (use repetition_penalty)"
    if body.logit_bias:
        return "logit_bias is not supported"
    if body.audio or (body.modalities and body.modalities != ["text"]):
        return "only text output is supported"
    return None


def check_supported(body: ChatCompletionRequest) -> None:
    """Refuse (InvalidArgument) a request whose answer we could not produce as asked."""
    reason = _refused(body)
    if reason is not None:
        raise InvalidArgument(reason)


def _count(name: str, value: int | None, limit: int = UINT32_MAX) -> int:
    """A non-negative count the gRPC API can carry too (None: 0, the server default)."""
    if value is None:
        return 0
    if not 0 <= value <= limit:
        raise InvalidArgument(f"{name}={value} is out of range (0..{limit})")
    return value


def _max_new_tokens(body: ChatCompletionRequest, clamp: bool = False) -> int:
    """The request's max new tokens (0: omitted); ``clamp``: one past uint32 is uint32's most (the generator
    clamps it to its limit) rather than refused."""
    name, value = ("max_completion_tokens", body.max_completion_tokens)
    if value is None:
        name, value = "max_tokens", body.max_tokens
    if value is not None and value < 1:
        raise InvalidArgument(f"{name} must be at least 1, got {value}")
    return _count(name, min(value, UINT32_MAX) if clamp and value is not None else value)


def _text(message: Message) -> str:
    """A message's text: its string content, or its text parts joined by newlines."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    kinds = {part.type for part in message.content} - {"text"}
    if kinds:
        raise InvalidArgument(f"only text content is supported, got {', '.join(sorted(kinds))}")
    return "\n".join(part.text or "" for part in message.content)


def generation_params(body: ChatCompletionRequest, clamp: bool = False) -> GenerationParams:
    """The request's GenerationParams (omitted = 0 = the server's default, as over gRPC; ``clamp``: see
    ``_max_new_tokens``)."""
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    seed = None if body.seed is None else _count("seed", body.seed, UINT64_MAX)
    return GenerationParams(
        max_new_tokens=_max_new_tokens(body, clamp), stop=stop, temperature=body.temperature or 0.0,
        top_p=body.top_p or 0.0, top_k=_count("top_k", body.top_k), min_p=body.min_p or 0.0,
        repetition_penalty=body.repetition_penalty or 0.0, seed=seed, safe_stream=body.safe_stream,
    )


def answer_query(body: ChatCompletionRequest, tenant: str) -> AnswerQuery:
    """RAG: the last message is the user's question, the messages before it its conversation (the generator
    checks their roles); the retriever builds the prompt around them. ``max_tokens`` omitted: up to the
    context; over the limit: clamped (``AnswerQuery.up_to_context``)."""
    *history, question = body.messages
    if question.role != "user":
        if not any(m.role == "user" for m in history):
            raise InvalidArgument("messages has no user message: the last one is the question")
        raise InvalidArgument(f"the last message is the question: a user message, not {question.role!r}")
    return AnswerQuery(tenant, _text(question), generation_params(body, clamp=True), k=_count("k", body.k),
                       m=_count("m", body.m), history=tuple(ChatMessage(m.role, _text(m)) for m in history),
                       up_to_context=True)


def generate_query(body: ChatCompletionRequest, tenant: str) -> GenerateQuery:
    """No retrieval (``"rag": false``): the messages as they are, in the model's chat template; ``max_tokens``
    as in RAG mode (omitted: up to the context; over the limit: clamped)."""
    messages = tuple(ChatMessage(ROLES.get(m.role, m.role), _text(m)) for m in body.messages)
    return GenerateQuery(tenant, messages, params=generation_params(body, clamp=True), up_to_context=True)


# ---- response -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """What every object of one response shares."""

    id: str
    model: str
    created: int
    token_ids: bool  # the return_token_ids extension
    include_usage: bool  # stream_options.include_usage
    rag: bool = True  # a RAG answer: the history_turns_kept extension

    @classmethod
    def of(cls, request_id: str, model: str, body: ChatCompletionRequest) -> Reply:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return cls(f"chatcmpl-{request_id}", model, int(time.time()), body.return_token_ids, usage, body.rag)

    def head(self, kind: str) -> Json:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def finish_reason(engine_reason: str) -> str:
    return FINISH_REASONS.get(engine_reason, engine_reason)


def usage(final: FinalInfo, *others: FinalInfo) -> Json:
    """OpenAI's usage of an answer, or of several choices of one prompt (``others``: the prompt counted
    once, the completions summed), plus ``max_tokens_allowed`` (what each could take; absent in a safe stream)."""
    prompt = len(final.prompt_ids)
    completion_tokens = final.stats.new_tokens + sum(f.stats.new_tokens for f in others)
    out: Json = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                 "total_tokens": prompt + completion_tokens}
    if final.stats.max_new_tokens:
        out["max_tokens_allowed"] = final.stats.max_new_tokens
    return out


def conversation(reply: Reply, final: FinalInfo) -> Json:
    """The ``history_turns_kept`` extension of a RAG answer (absent in a safe stream: its final tells
    nothing about the prompt, not even its ids)."""
    if not reply.rag or not final.prompt_ids:
        return {}
    return {"history_turns_kept": final.stats.history_turns_kept}


def prompt_headers(facts: PromptFacts | None) -> dict[str, str]:
    """The ``x-lookahead-history-turns-kept`` header of a RAG answer whose prompt is known (not a safe stream's)."""
    return {} if facts is None else {HISTORY_TURNS_HEADER: str(facts.history_turns_kept)}


def decoding(final: FinalInfo) -> Json:
    """The ``decoding`` extension: how the answer was decoded (absent in a safe stream, which has no per-step
    stats). ``lossless``: its tokens are those plain decoding gives (every mode but the opt-in mjsd)."""
    if not final.prompt_ids:
        return {}
    st = final.stats
    return {"decoding": {"new_tokens": st.new_tokens, "forward_steps": st.forward_steps,
                         "mean_accepted_per_step": round(st.mean_accepted_per_step, STAT_DIGITS),
                         "time_to_first_token_s": round(st.time_to_first_token_s, STAT_DIGITS),
                         "wall_s": round(st.wall_s, STAT_DIGITS), "lossless": not st.unverified}}


def documents(final: FinalInfo) -> list[Json]:
    """The documents the answer was grounded on (the ``documents`` extension field)."""
    return [{"doc_id": c.doc_id, "chunk_id": c.chunk_id, "title": c.title, "source": c.source,
             "score": round(c.score, SCORE_DIGITS), "text": c.text} for c in final.documents]


def citations(final: FinalInfo) -> list[Json]:
    """The documents' passages that support the answer (the ``citations`` extension field): ids and the
    character span of the supporting text in the chunk's text (empty in a safe stream)."""
    return [{"doc_id": c.doc_id, "chunk_id": c.chunk_id, "start": c.start, "end": c.end, "quote": c.quote}
            for c in final.citations]


def grounding(final: FinalInfo) -> Json:
    """The ``grounded`` extension field (absent when not checked: a safe stream) and, when the answer was
    withdrawn (``[generator] ungrounded = "abstain"``), the ``retraction``: the refusal a client shows
    in place of the text it streamed."""
    out: Json = {} if final.grounded is None else {"grounded": final.grounded}
    if final.retracted:
        out["retraction"] = {"content": final.answer_text}
    return out


def completion(reply: Reply, final: FinalInfo) -> Json:
    """The whole answer as one ``chat.completion``."""
    choice: Json = {"index": 0, "message": {"role": "assistant", "content": final.answer_text},
                    "logprobs": None, "finish_reason": finish_reason(final.stats.finish_reason)}
    body = {**reply.head("chat.completion"), "choices": [choice], "usage": usage(final),
            "documents": documents(final), "citations": citations(final), **grounding(final),
            **conversation(reply, final), **decoding(final)}
    if reply.token_ids:
        choice["token_ids"] = list(final.output_ids)
        body["prompt_token_ids"] = list(final.prompt_ids)
    return body


class StreamTranslator:
    """The generator's chunks -> ``chat.completion.chunk`` objects, in OpenAI's order: the first carries the
    role, each delta its text, the last the finish_reason and the documents, then (with
    include_usage) one with no choices and the usage."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.started = False

    def _chunk(self, delta: Json, finish: str | None = None, token_ids: list[int] | None = None) -> Json:
        choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = {**self.reply.head("chat.completion.chunk"), "choices": [choice]}
        if self.reply.token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        if self.reply.include_usage:
            body["usage"] = None
        return body

    def _delta(self, text: str) -> Json:
        if self.started:
            return {"content": text}
        self.started = True
        return {"role": "assistant", "content": text}

    def delta(self, delta: TextDelta) -> list[Json]:
        """One verified step (nothing when it adds neither text nor, when asked for, token ids; a safe
        stream's delta always makes one chunk: a missing event would tell)."""
        ids = list(delta.token_ids)
        if not delta.text and not (self.reply.token_ids and ids) and not delta.safe_bytes:
            return []
        return [self._chunk(self._delta(delta.text), token_ids=ids)]

    def largest_delta(self) -> Json:
        """The delta chunk with every field a delta chunk can have, empty (sizes a safe stream's events)."""
        return self._chunk({"role": "assistant", "content": ""}, token_ids=[])

    def final(self, final: FinalInfo) -> list[Json]:
        out = [] if self.started else [self._chunk(self._delta(""), token_ids=[])]
        last = self._chunk({}, finish_reason(final.stats.finish_reason))
        last["documents"] = documents(final)
        last["citations"] = citations(final)
        last.update(grounding(final))
        last.update(conversation(self.reply, final))
        last.update(decoding(final))
        if self.reply.token_ids:  # known only once the answer is done, like the documents
            last["prompt_token_ids"] = list(final.prompt_ids)
        out.append(last)
        if self.reply.include_usage:
            out.append({**self.reply.head("chat.completion.chunk"), "choices": [], "usage": usage(final)})
        return out
