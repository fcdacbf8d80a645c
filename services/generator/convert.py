"""Protobuf <-> generator domain types, in one place: the servicer, the engine's published event and
the safe stream's wire size use these (``lookahead_rag.services.generator.domain`` holds the types).

    query = answer_query(request)                 # AnswerRequest -> AnswerQuery
    async for chunk in engine.answer(query):
        yield chunk_to_proto(chunk)               # TextDelta | FinalInfo -> AnswerChunk

A safe stream's delta (``TextDelta.safe_bytes``) is padded here to the stream's one serialized size.
The engine's load in a final's stats (batch sizes, queue wait: other tenants' traffic) goes only to
callers who may see it (``chunk_to_proto(chunk, load=False)`` zeroes ``LOAD_FIELDS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields, replace

from lookahead_rag.services.generator.domain import (
    AnswerChunk,
    AnswerQuery,
    ChatMessage,
    DocumentChunk,
    FinalInfo,
    GenerateQuery,
    GenerationParams,
    GenerationStats,
    PromptIds,
    TextDelta,
    TokenLogprob,
)
from lookahead_rag.services.generator.prepared import Prepared, grounding_doc_ids
from lookahead_rag.services.retriever.citations import Citation
from lookahead_rag.v1 import events_pb2, generator_pb2, retriever_pb2

MIN_PADDING = 128  # padding lengths 128..16383 take a 2-byte length prefix: every size is reachable
PADDING_PREFIX_BYTES = 3  # the padding field's tag (1) and 2-byte length
MAX_TOKEN_ID = (1 << 32) - 1  # token ids are uint32: at most a 5-byte varint each
# GenerationStats fields that measure the engine, not the request: they show other tenants' load (the kernel
# chosen and the draft budget granted follow the forward's size, so the neighbours' traffic too)
LOAD_FIELDS = frozenset({"queue_wait_s", "mean_batch_size", "max_batch_size", "mean_tokens_per_forward",
                         "mean_draft_budget", "kernel"})


# ---- requests -------------------------------------------------------------------------------------
def params_from_proto(params: generator_pb2.GenerationParams) -> GenerationParams:
    return GenerationParams(
        max_new_tokens=params.max_new_tokens, mode=params.mode, decoding_length=params.decoding_length,
        branch_length=params.branch_length, stop=tuple(params.stop), temperature=params.temperature,
        top_p=params.top_p, top_k=params.top_k, min_p=params.min_p, repetition_penalty=params.repetition_penalty,
        seed=params.seed if params.HasField("seed") else None, safe_stream=params.safe_stream,
        logprobs=params.logprobs, top_logprobs=params.top_logprobs,
    )


def messages_from_proto(messages: Sequence[generator_pb2.ChatMessage]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(m.role, m.content) for m in messages)


def answer_query(request: generator_pb2.AnswerRequest) -> AnswerQuery:
    return AnswerQuery(request.tenant, request.question, params_from_proto(request.params), request.k, request.m,
                       messages_from_proto(request.history))


def generate_query(request: generator_pb2.GenerateRequest) -> GenerateQuery:
    which = request.WhichOneof("input")
    prompt: str | tuple[ChatMessage, ...] | PromptIds | None = None
    if which == "prompt":
        prompt = request.prompt
    elif which == "messages":
        prompt = messages_from_proto(request.messages.messages)
    elif which == "prompt_ids":
        prompt = PromptIds(tuple(request.prompt_ids.ids))
    return GenerateQuery(request.tenant, prompt, tuple(request.references), tuple(request.reference_ids),
                         params_from_proto(request.params))


# ---- replies --------------------------------------------------------------------------------------
def stats_to_proto(stats: GenerationStats) -> events_pb2.GenerationStats:
    return events_pb2.GenerationStats(**asdict(stats))


def document_to_proto(doc: DocumentChunk) -> retriever_pb2.Chunk:
    return retriever_pb2.Chunk(doc_id=doc.doc_id, chunk_id=doc.chunk_id, title=doc.title, source=doc.source,
                               text=doc.text, score=doc.score)


def final_to_proto(final: FinalInfo) -> generator_pb2.FinalInfo:
    return generator_pb2.FinalInfo(
        request_id=final.request_id, answer_text=final.answer_text, stats=stats_to_proto(final.stats),
        documents=[document_to_proto(d) for d in final.documents], prompt_ids=final.prompt_ids,
        output_ids=final.output_ids, citations=[citation_to_proto(c) for c in final.citations],
        grounded=final.grounded, retracted=final.retracted,  # grounded None: unset (not checked)
    )


def citation_to_proto(c: Citation) -> events_pb2.Citation:
    return events_pb2.Citation(doc_id=c.doc_id, chunk_id=c.chunk_id, start=c.start, end=c.end, quote=c.quote)


def logprob_to_proto(logprob: TokenLogprob) -> generator_pb2.TokenLogprob:
    return generator_pb2.TokenLogprob(token_id=logprob.token_id, logprob=logprob.logprob,
                                      top=[generator_pb2.TopLogprob(token_id=t, logprob=lp) for t, lp in logprob.top])


def delta_to_proto(delta: TextDelta) -> generator_pb2.TextDelta:
    """The delta on the wire; a safe stream's padded to its fixed size."""
    message = generator_pb2.TextDelta(text=delta.text, token_ids=delta.token_ids,
                                      logprobs=[logprob_to_proto(p) for p in delta.logprobs])
    return pad(message, padded_bytes(delta.safe_bytes)) if delta.safe_bytes else message


def without_load(final: FinalInfo) -> FinalInfo:
    """``final`` with its ``LOAD_FIELDS`` at their defaults (zero: absent on the wire)."""
    blank = {f.name: f.default for f in fields(GenerationStats) if f.name in LOAD_FIELDS}
    return replace(final, stats=replace(final.stats, **blank))


def chunk_to_proto(chunk: AnswerChunk, load: bool = True) -> generator_pb2.AnswerChunk:
    """``chunk`` on the wire; ``load=False``: a final without the engine's load (see ``LOAD_FIELDS``)."""
    if isinstance(chunk, FinalInfo):
        return generator_pb2.AnswerChunk(final=final_to_proto(chunk if load else without_load(chunk)))
    return generator_pb2.AnswerChunk(delta=delta_to_proto(chunk))


# ---- the published event --------------------------------------------------------------------------
def completed_event(prep: Prepared, final: FinalInfo, tokenizer_id: str, model: str, event_id: str,
                    created_unix_ms: int) -> events_pb2.GenerationCompleted:
    """The ``GenerationCompleted`` of ``prep``'s finished answer ``final`` (the bus's wire schema)."""
    return events_pb2.GenerationCompleted(
        event_id=event_id, tenant=prep.tenant, tokenizer_id=tokenizer_id, question=prep.question,
        prompt_ids=final.prompt_ids, output_ids=final.output_ids, answer_text=final.answer_text,
        stats=stats_to_proto(final.stats), created_unix_ms=created_unix_ms, request_id=final.request_id,
        model=model, doc_ids=grounding_doc_ids(final.documents),
        citations=[citation_to_proto(c) for c in final.citations], grounded=final.grounded, retracted=final.retracted,
    )


# ---- a safe stream's fixed delta size -------------------------------------------------------------
def largest_delta_bytes(text_bytes: int, chunk_tokens: int) -> int:
    """The serialized size of the largest delta holding at most ``chunk_tokens`` ids and ``text_bytes``
    bytes of text (``TextDelta.safe_bytes`` of a safe stream of such chunks)."""
    worst = generator_pb2.TextDelta(text="x" * text_bytes, token_ids=[MAX_TOKEN_ID] * chunk_tokens)
    return worst.ByteSize()


def padded_bytes(safe_bytes: int) -> int:
    """The serialized size of every padded delta of a safe stream: its largest delta plus the least padding."""
    return safe_bytes + PADDING_PREFIX_BYTES + MIN_PADDING


def pad(delta: generator_pb2.TextDelta, size: int) -> generator_pb2.TextDelta:
    """``delta`` with ``padding`` so that it serializes to exactly ``size`` bytes."""
    length = size - delta.ByteSize() - PADDING_PREFIX_BYTES
    if length < MIN_PADDING:
        raise ValueError(f"a delta of {delta.ByteSize()} bytes does not fit the safe size {size}")
    delta.padding = b"\0" * length
    assert delta.ByteSize() == size, (delta.ByteSize(), size)
    return delta
