from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddOutputRequest(_message.Message):
    __slots__ = ("tenant", "tokenizer_id", "output_ids", "event_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    tokenizer_id: str
    output_ids: _containers.RepeatedScalarFieldContainer[int]
    event_id: str
    def __init__(self, tenant: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., output_ids: _Optional[_Iterable[int]] = ..., event_id: _Optional[str] = ...) -> None: ...

class AddOutputResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    def __init__(self, applied: _Optional[bool] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("tenant", "tokenizer_id", "prompt_ids", "reference_ids", "budget")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    tokenizer_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    reference_ids: _containers.RepeatedScalarFieldContainer[int]
    budget: int
    def __init__(self, tenant: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., reference_ids: _Optional[_Iterable[int]] = ..., budget: _Optional[int] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("ids", "weight")
    IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    weight: float
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., weight: _Optional[float] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("continuations", "tokens")
    CONTINUATIONS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    continuations: _containers.RepeatedCompositeFieldContainer[Branch]
    tokens: int
    def __init__(self, continuations: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., tokens: _Optional[int] = ...) -> None: ...

class DraftStatsRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class TenantTrieStats(_message.Message):
    __slots__ = ("tenant", "tokenizer_id", "nodes", "bytes", "outputs")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    tokenizer_id: str
    nodes: int
    bytes: int
    outputs: int
    def __init__(self, tenant: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., nodes: _Optional[int] = ..., bytes: _Optional[int] = ..., outputs: _Optional[int] = ...) -> None: ...

class DraftStatsResponse(_message.Message):
    __slots__ = ("tries",)
    TRIES_FIELD_NUMBER: _ClassVar[int]
    tries: _containers.RepeatedCompositeFieldContainer[TenantTrieStats]
    def __init__(self, tries: _Optional[_Iterable[_Union[TenantTrieStats, _Mapping]]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("path", "bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    bytes: int
    def __init__(self, path: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...
