from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Document(_message.Message):
    __slots__ = ("id", "title", "text", "source")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    text: str
    source: str
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("tenant", "documents")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    def __init__(self, tenant: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("documents", "chunks", "total_chunks")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    chunks: int
    total_chunks: int
    def __init__(self, documents: _Optional[int] = ..., chunks: _Optional[int] = ..., total_chunks: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "title", "text", "source", "start", "end", "score")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    title: str
    text: str
    source: str
    start: int
    end: int
    score: float
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., source: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class PastSession(_message.Message):
    __slots__ = ("question", "answer", "score", "event_id")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    question: str
    answer: str
    score: float
    event_id: str
    def __init__(self, question: _Optional[str] = ..., answer: _Optional[str] = ..., score: _Optional[float] = ..., event_id: _Optional[str] = ...) -> None: ...

class HistoryMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class RetrieveRequest(_message.Message):
    __slots__ = ("tenant", "question", "k", "m", "max_new_tokens", "tokenizer_id", "history")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    question: str
    k: int
    m: int
    max_new_tokens: int
    tokenizer_id: str
    history: _containers.RepeatedCompositeFieldContainer[HistoryMessage]
    def __init__(self, tenant: _Optional[str] = ..., question: _Optional[str] = ..., k: _Optional[int] = ..., m: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., tokenizer_id: _Optional[str] = ..., history: _Optional[_Iterable[_Union[HistoryMessage, _Mapping]]] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("chunks", "sessions", "prompt", "prompt_ids", "tokenizer_id", "retrieve_ms", "notes", "unknown_tenant", "history_turns_kept")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    RETRIEVE_MS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TENANT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TURNS_KEPT_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    sessions: _containers.RepeatedCompositeFieldContainer[PastSession]
    prompt: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    tokenizer_id: str
    retrieve_ms: float
    notes: _containers.RepeatedScalarFieldContainer[str]
    unknown_tenant: bool
    history_turns_kept: int
    def __init__(self, chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[PastSession, _Mapping]]] = ..., prompt: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., tokenizer_id: _Optional[str] = ..., retrieve_ms: _Optional[float] = ..., notes: _Optional[_Iterable[str]] = ..., unknown_tenant: _Optional[bool] = ..., history_turns_kept: _Optional[int] = ...) -> None: ...

class RetrieverStatsRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class RetrieverStatsResponse(_message.Message):
    __slots__ = ("chunks", "sessions", "tenants", "model", "tokenizer_id")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    sessions: int
    tenants: _containers.RepeatedScalarFieldContainer[str]
    model: str
    tokenizer_id: str
    def __init__(self, chunks: _Optional[int] = ..., sessions: _Optional[int] = ..., tenants: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., tokenizer_id: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("tenant", "doc_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("tenant", "doc_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    doc_id: str
    def __init__(self, tenant: _Optional[str] = ..., doc_id: _Optional[str] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("event_id",)
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    def __init__(self, event_id: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("documents", "total_chunks")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    total_chunks: int
    def __init__(self, documents: _Optional[int] = ..., total_chunks: _Optional[int] = ...) -> None: ...
