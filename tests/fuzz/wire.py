"""Raw request bytes from the protobuf wire format: what no well-behaved client library would send.

A case is a schema-valid message (``tests.fuzz.messages``) with hand-made field encodings added,
or the valid bytes damaged, or random bytes; each names its bad-input classes:

- ``wire:invalid-utf8``: a string field (top-level or nested) whose bytes are not UTF-8;
- ``wire:wrong-wire-type``, ``wire:unknown-field``, ``wire:bad-field-number``, ``wire:bad-wire-type``;
- ``wire:length-past-end``, ``wire:overlong-varint``, ``wire:varint-out-of-range``, ``wire:bad-packed``;
- ``wire:bad-group``, ``wire:deep-nesting``, ``wire:nested`` (a bad encoding inside a sub-message);
- ``wire:truncated``, ``wire:bitflip``, ``wire:random-insert``, ``wire:duplicated``, ``wire:random-bytes``.

Everything is driven by the descriptor: which fields are strings, numbers, packed or messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from tests.fuzz.classes import message_classes
from tests.fuzz.messages import messages
from tests.fuzz.values import INVALID_UTF8, FuzzDictionary

F = FieldDescriptor

VARINT, I64, LEN, START_GROUP, END_GROUP, I32 = range(6)
VALID_WIRE_TYPES = (VARINT, I64, LEN, I32)
MAX_FIELD_NUMBER = 2**29 - 1
U64 = 2**64 - 1
U32 = 2**32 - 1
OVERLONG_VARINT = b"\xff" * 10 + b"\x01"  # 11 bytes: longer than any varint
NESTING = (50, 400)  # deep group nesting: from this many levels to this many
RANDOM_BYTES = 512  # most random bytes in one case
MAX_SEGMENTS = 3  # hand-made encodings added to one valid message
WIRE_DEPTH = 2  # bad encodings inside sub-messages go this deep
PAST_END = 1 << 20  # a length prefix claims this many bytes more than there are

EXPECTED_WIRE = {
    F.TYPE_DOUBLE: I64, F.TYPE_FIXED64: I64, F.TYPE_SFIXED64: I64,
    F.TYPE_FLOAT: I32, F.TYPE_FIXED32: I32, F.TYPE_SFIXED32: I32,
    F.TYPE_STRING: LEN, F.TYPE_BYTES: LEN, F.TYPE_MESSAGE: LEN,
    F.TYPE_GROUP: START_GROUP,
}  # every other type (ints, bool, enum) is a varint


@dataclass(frozen=True)
class Encoded:
    """Request bytes and the bad-input classes they carry."""

    data: bytes
    classes: frozenset[str]


def varint(value: int) -> bytes:
    value &= U64  # negative numbers go out as their 10-byte two's complement, as protobuf does
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def delimited(number: int, payload: bytes) -> bytes:
    return key(number, LEN) + varint(len(payload)) + payload


def _packed(field: FieldDescriptor) -> bool:
    """Repeated numbers go packed (proto3's default) unless the descriptor says otherwise."""
    numeric = field.message_type is None and field.type not in (F.TYPE_STRING, F.TYPE_BYTES)
    return field.is_repeated and numeric and bool(getattr(field, "is_packed", True))


def expected_wire(field: FieldDescriptor) -> int:
    if _packed(field):
        return LEN
    return EXPECTED_WIRE.get(field.type, VARINT)


def body(wire_type: int, number: int, value: int, blob: bytes) -> bytes:
    """A well-formed payload of ``wire_type`` (after its key)."""
    if wire_type == VARINT:
        return varint(value)
    if wire_type == I64:
        return struct.pack("<Q", value & U64)
    if wire_type == I32:
        return struct.pack("<I", value & U32)
    if wire_type == START_GROUP:
        return key(number, END_GROUP)
    return varint(len(blob)) + blob


def _one(data: bytes, *classes: str) -> Encoded:
    return Encoded(data, frozenset(classes))


def segments(descriptor: Descriptor, words: FuzzDictionary, depth: int = 0) -> st.SearchStrategy[Encoded]:
    """One hand-made field encoding for a message of ``descriptor``'s type (see the module doc)."""
    fields = list(descriptor.fields)
    numbers = {f.number for f in fields}
    ints = st.integers(0, U64)
    blobs = st.binary(max_size=16)
    options: list[st.SearchStrategy[Encoded]] = []
    strings = [f.number for f in fields if f.type == F.TYPE_STRING]
    if strings:
        options.append(st.builds(
            lambda n, prefix, bad: _one(delimited(n, prefix.encode() + bad), "wire:invalid-utf8"),
            st.sampled_from(strings), st.text(max_size=8), st.sampled_from(INVALID_UTF8)))
    if fields:
        options.append(st.builds(_wrong_type, st.sampled_from(fields), st.sampled_from(VALID_WIRE_TYPES), ints, blobs))
        options.append(st.builds(
            lambda n: _one(key(n, VARINT) + OVERLONG_VARINT, "wire:overlong-varint"),
            st.sampled_from(sorted(numbers))))
        options.append(st.builds(
            lambda n, got: _one(key(n, LEN) + varint(len(got) + PAST_END) + got, "wire:length-past-end"),
            st.sampled_from(sorted(numbers)), blobs))
    varints = [f.number for f in fields if expected_wire(f) == VARINT]
    if varints:
        options.append(st.builds(
            lambda n, v: _one(key(n, VARINT) + varint(v), "wire:varint-out-of-range"),
            st.sampled_from(varints), st.integers(2**32, U64) | st.integers(-(2**63), -1)))
    packed = [f.number for f in fields if _packed(f)]
    if packed:
        options.append(st.builds(
            lambda n, junk: _one(delimited(n, junk), "wire:bad-packed"),
            st.sampled_from(packed), st.sampled_from([b"\x80", b"\xff\xff", b"\x01\x02\x03", b"\x80" * 11])))
    unknown = st.integers(1, MAX_FIELD_NUMBER).filter(lambda n: n not in numbers)
    options.append(st.builds(
        lambda n, w, v, b: _one(key(n, w) + body(w, n, v, b), "wire:unknown-field"),
        unknown, st.sampled_from((*VALID_WIRE_TYPES, START_GROUP)), ints, blobs))
    options.append(st.builds(
        lambda n: _one(key(n, VARINT) + b"\x01", "wire:bad-field-number"),
        st.just(0) | st.integers(MAX_FIELD_NUMBER + 1, 2**60)))
    options.append(st.builds(
        lambda n, w: _one(key(n, w) + b"\x01\x02\x03\x04\x05\x06\x07\x08", "wire:bad-wire-type"),
        st.integers(1, MAX_FIELD_NUMBER), st.sampled_from((6, 7))))
    options.append(st.builds(
        lambda n, end: _one(key(n, END_GROUP if end else START_GROUP), "wire:bad-group"),
        st.integers(1, MAX_FIELD_NUMBER), st.booleans()))
    options.append(st.builds(_deep_groups, st.integers(*NESTING)))
    nested = [f for f in fields if f.message_type is not None and f.type == F.TYPE_MESSAGE]
    if nested and depth < WIRE_DEPTH:
        options += [st.builds(_inside, st.just(f.number), damaged(f.message_type, words, depth + 1)) for f in nested]
    return st.one_of(options)


def _wrong_type(field: FieldDescriptor, wire_type: int, value: int, blob: bytes) -> Encoded:
    if wire_type == expected_wire(field):
        wire_type = VARINT if wire_type != VARINT else I32
    return _one(key(field.number, wire_type) + body(wire_type, field.number, value, blob), "wire:wrong-wire-type")


def _inside(number: int, inner: Encoded) -> Encoded:
    return Encoded(delimited(number, inner.data), inner.classes | {"wire:nested"})


def _deep_groups(levels: int) -> Encoded:
    number = MAX_FIELD_NUMBER  # unknown to every message here
    return _one(key(number, START_GROUP) * levels + key(number, END_GROUP) * levels, "wire:deep-nesting")


def _valid(descriptor: Descriptor, words: FuzzDictionary) -> st.SearchStrategy[Encoded]:
    return messages(descriptor, words).map(lambda m: Encoded(m.SerializeToString(), frozenset(message_classes(m))))


def _with_segments(valid: Encoded, added: list[Encoded], before: bool) -> Encoded:
    extra = b"".join(a.data for a in added)
    data = extra + valid.data if before else valid.data + extra
    return Encoded(data, valid.classes.union(*(a.classes for a in added)))


def damaged(descriptor: Descriptor, words: FuzzDictionary, depth: int = 0) -> st.SearchStrategy[Encoded]:
    """A valid message with one to ``MAX_SEGMENTS`` hand-made field encodings added before or after it."""
    return st.builds(_with_segments, _valid(descriptor, words),
                     st.lists(segments(descriptor, words, depth), min_size=1, max_size=MAX_SEGMENTS), st.booleans())


def _mutate(valid: Encoded, how: str, at: int, junk: bytes, bit: int) -> Encoded:
    data = valid.data
    where = at % (len(data) + 1)
    if how == "wire:truncated":
        data = data[:where] if where < len(data) else data[:-1]
    elif how == "wire:bitflip" and data:
        i = where % len(data)
        data = data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1:]
    elif how == "wire:random-insert":
        data = data[:where] + junk + data[where:]
    else:
        how = "wire:duplicated"  # concatenated messages merge: repeated fields double, the last scalar wins
        data = data + data
    return Encoded(data, valid.classes | {how})


def mutated(descriptor: Descriptor, words: FuzzDictionary) -> st.SearchStrategy[Encoded]:
    """A valid message's bytes truncated, bit-flipped, spliced with random bytes, or doubled."""
    hows = st.sampled_from(("wire:truncated", "wire:bitflip", "wire:random-insert", "wire:duplicated"))
    return st.builds(_mutate, _valid(descriptor, words), hows, st.integers(0, 2**16),
                     st.binary(min_size=1, max_size=16), st.integers(0, 7))


def random_bytes() -> st.SearchStrategy[Encoded]:
    return st.binary(max_size=RANDOM_BYTES).map(lambda b: _one(b, "wire:random-bytes"))


def wire_cases(descriptor: Descriptor, words: FuzzDictionary) -> st.SearchStrategy[Encoded]:
    """Raw request bytes for ``descriptor``'s type: damaged, mutated or random."""
    return st.one_of(damaged(descriptor, words), mutated(descriptor, words), random_bytes())
