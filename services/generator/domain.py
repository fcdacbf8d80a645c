"""The generator's requests and replies as plain values: what ``GeneratorCore`` takes and yields.

Both doors build them: the gRPC servicer from protobuf (``lookahead_rag.services.generator.convert``, the only
protobuf <-> domain code), the OpenAI endpoint from its JSON (``lookahead_rag.services.http.translate``). Values
mean what the proto's fields mean (0 / empty: the server's default) and are checked by the generator,
one way for both doors.

    query = AnswerQuery("acme", "How do I pretty-print JSON?", GenerationParams(max_new_tokens=32))
    async for chunk in generator.answer(query):      # TextDelta ... TextDelta, then one FinalInfo
        ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lookahead_rag.services.retriever.citations import Citation


@dataclass(frozen=True)
class GenerationParams:
    """How one request decodes (0 / empty: the server's default; temperature 0: greedy)."""

    max_new_tokens: int = 0  # most tokens generated (0: [limits] default_max_new_tokens)
    mode: str = ""  # draft mode by name ("": [generator] mode); mjsd is lossy, by name only
    decoding_length: int = 0  # draft tokens per forward (0: the server's)
    branch_length: int = 0  # the request trie's branch length (0: the server's)
    stop: tuple[str, ...] = ()  # stop strings (not included in the output)
    temperature: float = 0.0  # >= 0; 0: greedy
    top_p: float = 0.0  # (0, 1]; 0: off
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # [0, 1]; 0: off
    repetition_penalty: float = 0.0  # > 0; 0: the model's generation_config
    seed: int | None = None  # the sampling seed; None: a random one, reported in the final stats
    safe_stream: bool = False  # the side-channel-safe stream (services/generator/safe_stream.py)
    logprobs: bool = False  # each token's logprob on the deltas (raw model distribution, before sampling's processing)
    top_logprobs: int = 0  # 0..20: the most likely alternatives at each token's position (needs logprobs)


@dataclass(frozen=True)
class AnswerQuery:
    """A tenant's question, answered on its retrieved documents (``GeneratorCore.answer``)."""

    tenant: str  # whose documents, past sessions, drafts and quota
    question: str  # the user's question (a conversation's last user turn); the retriever builds the prompt around it
    params: GenerationParams = field(default_factory=GenerationParams)  # how to decode
    k: int = 0  # documents to retrieve (0: the server's)
    m: int = 0  # past sessions to include (0: the server's)
    history: tuple[ChatMessage, ...] = ()  # the conversation before the question, oldest first (its newest turns fit)
    # the OpenAI endpoint's max_tokens rule (not on the wire): max_new_tokens 0 is up to the context, within
    # [limits] max_new_tokens, and one over that limit is clamped to it (False: gRPC's, the default / refused)
    up_to_context: bool = False


@dataclass(frozen=True)
class ChatMessage:
    """One message of a caller-built chat."""

    role: str  # "system" | "user" | "assistant" (others are refused)
    content: str  # its text


@dataclass(frozen=True)
class PromptIds:
    """A caller-built prompt as token ids of the served model, decoded verbatim (no template)."""

    ids: tuple[int, ...]  # the prompt's token ids (checked against the tokenizer's vocabulary)


@dataclass(frozen=True)
class GenerateQuery:
    """A caller-built prompt, decoded without retrieval (``GeneratorCore.generate``)."""

    tenant: str  # whose drafts and quota
    # raw text, messages in the chat template, or token ids as they are; None: refused
    prompt: str | tuple[ChatMessage, ...] | PromptIds | None = None
    references: tuple[str, ...] = ()  # texts whose spans may be copied as drafts (LLMA)
    reference_ids: tuple[int, ...] = ()  # one more reference, as token ids of the served model
    params: GenerationParams = field(default_factory=GenerationParams)  # how to decode
    # the OpenAI endpoint's max_tokens rule, as AnswerQuery.up_to_context (False: gRPC's, the default / refused)
    up_to_context: bool = False


@dataclass(frozen=True)
class DocumentChunk:
    """A retrieved chunk an answer was grounded on."""

    doc_id: str  # its document
    chunk_id: str  # "<doc id>#<n>"
    title: str  # its document's title
    source: str  # its document's source (a URL, a path), as ingested
    text: str  # the chunk's text
    score: float  # inner product of the normalized embeddings of question and chunk


@dataclass(frozen=True)
class GenerationStats:
    """How an answer was made (field for field ``events_pb2.GenerationStats``, which documents each)."""

    new_tokens: int = 0  # tokens emitted (bonus tokens included)
    forward_steps: int = 0  # model forwards after prefill
    mean_accepted_per_step: float = 0.0  # new_tokens / forward_steps
    prefill_s: float = 0.0  # time in the prompt forward
    wall_s: float = 0.0  # request start to the end of decoding
    time_to_first_token_s: float = 0.0  # request start to the first streamed token (0: none came)
    documents_available: bool = False  # the retriever answered in time
    drafts_available: bool = False  # the draft cache answered in time
    finish_reason: str = ""  # "eos" | "stop" | "length" | "cancelled"
    draft_tokens_from_prompt: int = 0  # accepted draft tokens that came from the prompt
    draft_tokens_from_cache: int = 0  # ... from the tenant's past outputs
    draft_tokens_from_references: int = 0  # ... from the request's references
    queue_wait_s: float = 0.0  # admitted to first scheduled
    prefix_hit_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    mean_batch_size: float = 0.0  # requests per forward, over the forwards this request rode in
    max_batch_size: int = 0  # most requests in one of those forwards
    mean_tokens_per_forward: float = 0.0  # tokens per forward (all requests), over the same forwards
    mean_draft_budget: float = 0.0  # draft tokens granted per step, on average
    kernel: str = ""  # the kernels chosen for this request's forwards, comma-separated
    sampled: bool = False  # sampled (temperature > 0) rather than greedy
    seed: int = 0  # the sampling seed used: the same seed gives the same text
    unverified: bool = False  # lossy mode (mjsd): the output may differ from plain decoding
    history_turns_kept: int = 0  # Answer: the conversation's newest turns in the prompt (the oldest are cut first)
    max_new_tokens: int = 0  # the most tokens the answer was allowed (the request's, its default or its rule's)


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability (GenerationParams.logprobs) and its position's top alternatives."""

    token_id: int  # the token
    logprob: float  # its log-probability under the model's raw next-token distribution
    top: tuple[tuple[int, float], ...] = ()  # the top_logprobs most likely (token id, logprob), most likely first


@dataclass(frozen=True)
class TextDelta:
    """One verified step of the answer (a safe stream: one fixed-size chunk of it)."""

    text: str = ""  # newly verified text (whole characters)
    token_ids: tuple[int, ...] = ()  # the tokens verified in this step
    safe_bytes: int = 0  # safe stream: the most serialized bytes any of its deltas holds, padded to more; 0: none
    logprobs: tuple[TokenLogprob, ...] = ()  # GenerationParams.logprobs: one per token of token_ids (else empty)


@dataclass(frozen=True)
class FinalInfo:
    """The stream's last message: the whole answer and how it was made (a safe stream: little of it)."""

    request_id: str  # the request's id (logs, the published event)
    stats: GenerationStats  # how it was made
    answer_text: str = ""  # the whole answer's text
    documents: tuple[DocumentChunk, ...] = ()  # what it was grounded on
    prompt_ids: tuple[int, ...] = ()  # the decoded prompt
    output_ids: tuple[int, ...] = ()  # the answer's tokens
    citations: tuple[Citation, ...] = ()  # the documents' passages that support the answer (retriever/citations.py)
    grounded: bool | None = None  # whether they support it (retriever/grounded.py); None: not checked
    retracted: bool = False  # [generator] ungrounded = "abstain": the streamed text is withdrawn, answer_text refuses


AnswerChunk = TextDelta | FinalInfo  # what the generator streams: deltas, then one FinalInfo
