from lookahead_rag.v1 import events_pb2 as _events_pb2
from lookahead_rag.v1 import retriever_pb2 as _retriever_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerationParams(_message.Message):
    __slots__ = ("max_new_tokens", "mode", "decoding_length", "branch_length", "stop", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "safe_stream", "logprobs", "top_logprobs")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DECODING_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BRANCH_LENGTH_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAFE_STREAM_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    mode: str
    decoding_length: int
    branch_length: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    seed: int
    safe_stream: bool
    logprobs: bool
    top_logprobs: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., mode: _Optional[str] = ..., decoding_length: _Optional[int] = ..., branch_length: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., safe_stream: _Optional[bool] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class AnswerRequest(_message.Message):
    __slots__ = ("tenant", "question", "params", "k", "m", "history")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    question: str
    params: GenerationParams
    k: int
    m: int
    history: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, tenant: _Optional[str] = ..., question: _Optional[str] = ..., params: _Optional[_Union[GenerationParams, _Mapping]] = ..., k: _Optional[int] = ..., m: _Optional[int] = ..., history: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("tenant", "prompt", "messages", "prompt_ids", "references", "params", "reference_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    prompt: str
    messages: ChatMessages
    prompt_ids: TokenIds
    references: _containers.RepeatedScalarFieldContainer[str]
    params: GenerationParams
    reference_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tenant: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., references: _Optional[_Iterable[str]] = ..., params: _Optional[_Union[GenerationParams, _Mapping]] = ..., reference_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text", "token_ids", "padding", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    padding: bytes
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., padding: _Optional[bytes] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class FinalInfo(_message.Message):
    __slots__ = ("request_id", "answer_text", "stats", "documents", "prompt_ids", "output_ids", "citations", "grounded", "retracted")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TEXT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    GROUNDED_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    answer_text: str
    stats: _events_pb2.GenerationStats
    documents: _containers.RepeatedCompositeFieldContainer[_retriever_pb2.Chunk]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    output_ids: _containers.RepeatedScalarFieldContainer[int]
    citations: _containers.RepeatedCompositeFieldContainer[_events_pb2.Citation]
    grounded: bool
    retracted: bool
    def __init__(self, request_id: _Optional[str] = ..., answer_text: _Optional[str] = ..., stats: _Optional[_Union[_events_pb2.GenerationStats, _Mapping]] = ..., documents: _Optional[_Iterable[_Union[_retriever_pb2.Chunk, _Mapping]]] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., output_ids: _Optional[_Iterable[int]] = ..., citations: _Optional[_Iterable[_Union[_events_pb2.Citation, _Mapping]]] = ..., grounded: _Optional[bool] = ..., retracted: _Optional[bool] = ...) -> None: ...

class AnswerChunk(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: TextDelta
    final: FinalInfo
    def __init__(self, delta: _Optional[_Union[TextDelta, _Mapping]] = ..., final: _Optional[_Union[FinalInfo, _Mapping]] = ...) -> None: ...
