from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerationStats(_message.Message):
    __slots__ = ("new_tokens", "forward_steps", "mean_accepted_per_step", "prefill_s", "draft_s", "forward_s", "cache_s", "wall_s", "time_to_first_token_s", "documents_available", "drafts_available", "finish_reason", "draft_tokens_from_prompt", "draft_tokens_from_cache", "draft_tokens_from_references", "queue_wait_s", "prefix_hit_tokens", "mean_batch_size", "max_batch_size", "mean_tokens_per_forward", "mean_draft_budget", "kernel", "sampled", "seed", "unverified", "history_turns_kept", "max_new_tokens")
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_STEPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_S_FIELD_NUMBER: _ClassVar[int]
    FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_S_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FROM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FROM_CACHE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FROM_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKENS_PER_FORWARD_FIELD_NUMBER: _ClassVar[int]
    MEAN_DRAFT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TURNS_KEPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    new_tokens: int
    forward_steps: int
    mean_accepted_per_step: float
    prefill_s: float
    draft_s: float
    forward_s: float
    cache_s: float
    wall_s: float
    time_to_first_token_s: float
    documents_available: bool
    drafts_available: bool
    finish_reason: str
    draft_tokens_from_prompt: int
    draft_tokens_from_cache: int
    draft_tokens_from_references: int
    queue_wait_s: float
    prefix_hit_tokens: int
    mean_batch_size: float
    max_batch_size: int
    mean_tokens_per_forward: float
    mean_draft_budget: float
    kernel: str
    sampled: bool
    seed: int
    unverified: bool
    history_turns_kept: int
    max_new_tokens: int
    def __init__(self, new_tokens: _Optional[int] = ..., forward_steps: _Optional[int] = ..., mean_accepted_per_step: _Optional[float] = ..., prefill_s: _Optional[float] = ..., draft_s: _Optional[float] = ..., forward_s: _Optional[float] = ..., cache_s: _Optional[float] = ..., wall_s: _Optional[float] = ..., time_to_first_token_s: _Optional[float] = ..., documents_available: _Optional[bool] = ..., drafts_available: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., draft_tokens_from_prompt: _Optional[int] = ..., draft_tokens_from_cache: _Optional[int] = ..., draft_tokens_from_references: _Optional[int] = ..., queue_wait_s: _Optional[float] = ..., prefix_hit_tokens: _Optional[int] = ..., mean_batch_size: _Optional[float] = ..., max_batch_size: _Optional[int] = ..., mean_tokens_per_forward: _Optional[float] = ..., mean_draft_budget: _Optional[float] = ..., kernel: _Optional[str] = ..., sampled: _Optional[bool] = ..., seed: _Optional[int] = ..., unverified: _Optional[bool] = ..., history_turns_kept: _Optional[int] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class GenerationCompleted(_message.Message):
    __slots__ = ("event_id", "tenant", "tokenizer_id", "question", "prompt_ids", "output_ids", "answer_text", "stats", "created_unix_ms", "request_id", "model", "doc_ids", "citations", "grounded", "retracted")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TEXT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    GROUNDED_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    tenant: str
    tokenizer_id: str
    question: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    output_ids: _containers.RepeatedScalarFieldContainer[int]
    answer_text: str
    stats: GenerationStats
    created_unix_ms: int
    request_id: str
    model: str
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    citations: _containers.RepeatedCompositeFieldContainer[Citation]
    grounded: bool
    retracted: bool
    def __init__(self, event_id: _Optional[str] = ..., tenant: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., question: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., output_ids: _Optional[_Iterable[int]] = ..., answer_text: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., created_unix_ms: _Optional[int] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ..., doc_ids: _Optional[_Iterable[str]] = ..., citations: _Optional[_Iterable[_Union[Citation, _Mapping]]] = ..., grounded: _Optional[bool] = ..., retracted: _Optional[bool] = ...) -> None: ...

class Citation(_message.Message):
    __slots__ = ("doc_id", "chunk_id", "start", "end", "quote")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    chunk_id: str
    start: int
    end: int
    quote: str
    def __init__(self, doc_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., quote: _Optional[str] = ...) -> None: ...

class DocumentChanged(_message.Message):
    __slots__ = ("event_id", "tenant", "doc_id", "version", "deleted", "title", "text", "source", "created_unix_ms", "request_id")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    tenant: str
    doc_id: str
    version: str
    deleted: bool
    title: str
    text: str
    source: str
    created_unix_ms: int
    request_id: str
    def __init__(self, event_id: _Optional[str] = ..., tenant: _Optional[str] = ..., doc_id: _Optional[str] = ..., version: _Optional[str] = ..., deleted: _Optional[bool] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., source: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ForgetRequested(_message.Message):
    __slots__ = ("event_id", "tenant", "doc_id", "created_unix_ms", "request_id")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    tenant: str
    doc_id: str
    created_unix_ms: int
    request_id: str
    def __init__(self, event_id: _Optional[str] = ..., tenant: _Optional[str] = ..., doc_id: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...
