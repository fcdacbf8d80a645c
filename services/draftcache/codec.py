"""The draft cache snapshot format (versioned, little-endian binary, checksummed).

    MAGIC | u32 version | u32 crc32(payload) | u64 len(payload) | payload

payload (version 1):

    u32 tenants with applied event ids, each:  str tenant | u32 n | n x str event id (oldest first)
    u32 scopes, each:  str tenant | str tokenizer id | bytes trie (TokenTrie.dump_outputs)
                       | u32 outputs kept whole, each: u64 count | u32 n | n x u32 token id
                         (least recently seen first)

version 2 appends, per scope in the same order, the outputs it can forget (``forget.OutputLog``):

    u32 complete (0/1) | u32 logged outputs, each: u32 n | n x u32 token id | u32 d | d x str doc id
                                                  (oldest first)

and then ``bytes`` of the forget ledger (``lookahead_rag.services.events.forget.ForgetLedger.to_bytes``). Version 1
snapshots still load: their scopes have an empty, incomplete log and the ledger is empty.

str / bytes = u32 (bytes: u64) length + data (str: UTF-8).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field

MAGIC = b"LARDRAFT"
VERSION = 2
LOG_VERSION = 2  # the first version with the forget log and ledger
READABLE_VERSIONS = (1, 2)  # versions decode() accepts (1: before forgetting)
_HEAD = struct.Struct("<IIQ")  # version, crc32 of the payload, payload length
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
TOKEN_TYPECODE = "I"  # array typecode of a token id: unsigned 32-bit


class SnapshotError(ValueError):
    """Bytes that are not a draft cache snapshot this code can read (foreign, newer, or damaged)."""


@dataclass
class ScopeState:
    tenant: str
    tokenizer_id: str
    trie: bytes  # TokenTrie.dump_outputs()
    outputs: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (ids, count), oldest first
    log: list[tuple[tuple[int, ...], tuple[str, ...]]] = field(default_factory=list)  # (ids, doc ids), oldest first
    complete: bool = False  # the log holds every output in the trie


@dataclass
class StoreState:
    applied: dict[str, list[str]] = field(default_factory=dict)  # tenant -> event ids, oldest first
    scopes: list[ScopeState] = field(default_factory=list)
    ledger: bytes = b""  # ForgetLedger.to_bytes() (empty: no forget applied)


def _token_array(ids: tuple[int, ...]) -> array[int]:
    arr = array(TOKEN_TYPECODE, ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def u32(self, value: int) -> None:
        self.buf += _U32.pack(value)

    def u64(self, value: int) -> None:
        self.buf += _U64.pack(value)

    def text(self, value: str) -> None:
        data = value.encode()
        self.u32(len(data))
        self.buf += data

    def blob(self, data: bytes) -> None:
        self.u64(len(data))
        self.buf += data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0

    def _take(self, size: int) -> memoryview:
        if self.pos + size > len(self.view):
            raise SnapshotError("truncated snapshot")
        chunk = self.view[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def u32(self) -> int:
        return int(_U32.unpack(self._take(_U32.size))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self._take(_U64.size))[0])

    def text(self) -> str:
        try:
            return bytes(self._take(self.u32())).decode()
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"bad text in snapshot: {exc}") from exc

    def blob(self) -> bytes:
        return bytes(self._take(self.u64()))

    def tokens(self, n: int) -> tuple[int, ...]:
        arr = array(TOKEN_TYPECODE)
        arr.frombytes(self._take(n * arr.itemsize))
        if sys.byteorder != "little":
            arr.byteswap()
        return tuple(arr)


def encode(state: StoreState) -> bytes:
    w = _Writer()
    w.u32(len(state.applied))
    for tenant, ids in state.applied.items():
        w.text(tenant)
        w.u32(len(ids))
        for event_id in ids:
            w.text(event_id)
    w.u32(len(state.scopes))
    for scope in state.scopes:
        w.text(scope.tenant)
        w.text(scope.tokenizer_id)
        w.blob(scope.trie)
        w.u32(len(scope.outputs))
        for ids, count in scope.outputs:
            w.u64(count)
            w.u32(len(ids))
            w.buf += _token_array(ids).tobytes()
    for scope in state.scopes:
        w.u32(int(scope.complete))
        w.u32(len(scope.log))
        for ids, doc_ids in scope.log:
            w.u32(len(ids))
            w.buf += _token_array(ids).tobytes()
            w.u32(len(doc_ids))
            for doc_id in doc_ids:
                w.text(doc_id)
    w.blob(state.ledger)
    payload = bytes(w.buf)
    return MAGIC + _HEAD.pack(VERSION, zlib.crc32(payload), len(payload)) + payload


def decode(data: bytes) -> StoreState:
    if not data.startswith(MAGIC):
        raise SnapshotError("not a draft cache snapshot")
    if len(data) < len(MAGIC) + _HEAD.size:
        raise SnapshotError("truncated snapshot header")
    version, crc, size = _HEAD.unpack_from(data, len(MAGIC))
    if version not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot version {version} is not supported (this code reads {READABLE_VERSIONS})")
    payload = data[len(MAGIC) + _HEAD.size :]
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise SnapshotError("snapshot checksum or length mismatch (damaged file)")
    r = _Reader(payload)
    state = StoreState()
    for _ in range(r.u32()):
        tenant = r.text()
        state.applied[tenant] = [r.text() for _ in range(r.u32())]
    for _ in range(r.u32()):
        scope = ScopeState(tenant=r.text(), tokenizer_id=r.text(), trie=r.blob())
        for _ in range(r.u32()):
            count = r.u64()
            scope.outputs.append((r.tokens(r.u32()), count))
        state.scopes.append(scope)
    if version >= LOG_VERSION:
        for scope in state.scopes:
            scope.complete = bool(r.u32())
            for _ in range(r.u32()):
                ids = r.tokens(r.u32())
                scope.log.append((ids, tuple(r.text() for _ in range(r.u32()))))
        state.ledger = r.blob()
    if r.pos != len(payload):
        raise SnapshotError("trailing bytes after the snapshot")
    return state
