"""Bad-input classes: what kind of hostile value a request carried (``string:huge``, ``float:nan``,
``enum:unknown``, ``wire:invalid-utf8`` ...), so the report can count the classes tried and refused.

``message_classes`` walks a message through its descriptor (every field, set or not); the wire
cases name their own classes (``tests.fuzz.wire``).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterator
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from tests.fuzz.messages import is_map
from tests.fuzz.values import FLOAT_MAX, HUGE_MIN, INT_RANGES, WIDTH_BITS

F = FieldDescriptor

LONG_TEXT = 256  # "long" strings and bytes, below "huge" (tests.fuzz.values.HUGE_MIN)
MANY = 100  # a repeated field with more elements than this is "many"
SMALLEST_NORMAL = {32: 1.1754943508222875e-38, 64: 2.2250738585072014e-308}
ODD_CATEGORIES = {"Cc", "Cf", "Co", "Cn", "Zl", "Zp", "Mn"}  # controls, format, private use, unassigned, marks
ASTRAL = 0xFFFF  # code points above this are outside the BMP
NONCHARACTERS = frozenset({0xFFFE, 0xFFFF}) | frozenset(range(0xFDD0, 0xFDF0))


def text_classes(value: str) -> Iterator[str]:
    if not value:
        yield "string:empty"
        return
    if not value.strip():
        yield "string:blank"
    if len(value) >= HUGE_MIN:
        yield "string:huge"
    elif len(value) > LONG_TEXT:
        yield "string:long"
    if "\x00" in value:
        yield "string:nul"
    points = {ord(c) for c in set(value)}
    if any(p > ASTRAL for p in points):
        yield "string:astral"
    if any(p in NONCHARACTERS or (p & 0xFFFE) == 0xFFFE for p in points):
        yield "string:noncharacter"
    if any(unicodedata.category(chr(p)) in ODD_CATEGORIES for p in points):
        yield "string:control-or-format"


def bytes_classes(value: bytes) -> Iterator[str]:
    if not value:
        yield "bytes:empty"
        return
    if len(value) >= HUGE_MIN:
        yield "bytes:huge"
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        yield "bytes:invalid-utf8"


def int_classes(kind: int, value: int) -> Iterator[str]:
    lo, hi = INT_RANGES[kind]
    if value == 0:
        yield "int:zero"
    if value == hi:
        yield "int:max"
    if lo < 0 and value == lo:
        yield "int:min"
    if value < 0:
        yield "int:negative"
    if value > 2**31 - 1:
        yield "int:over-int32"


def float_classes(bits: int, value: float) -> Iterator[str]:
    if math.isnan(value):
        yield "float:nan"
    elif math.isinf(value):
        yield "float:+inf" if value > 0 else "float:-inf"
    elif value == 0.0 and math.copysign(1.0, value) < 0:
        yield "float:-0.0"
    elif value != 0.0 and abs(value) < SMALLEST_NORMAL[bits]:
        yield "float:subnormal"
    elif abs(value) >= FLOAT_MAX[bits]:
        yield "float:max-finite"
    elif value < 0:
        yield "float:negative"


def value_classes(field: FieldDescriptor, value: Any) -> Iterator[str]:
    kind = field.type
    if field.message_type is not None:
        yield from message_classes(value)
    elif kind == F.TYPE_STRING:
        yield from text_classes(value)
    elif kind == F.TYPE_BYTES:
        yield from bytes_classes(value)
    elif kind == F.TYPE_ENUM:
        if field.enum_type.values_by_number.get(value) is None:
            yield "enum:unknown"
    elif kind in WIDTH_BITS:
        yield from float_classes(WIDTH_BITS[kind], value)
    elif kind in INT_RANGES:
        yield from int_classes(kind, value)


def _is_optional(field: FieldDescriptor) -> bool:
    """A proto3 ``optional`` field: the only member of its own (synthetic) oneof."""
    oneof = field.containing_oneof
    return oneof is not None and len(oneof.fields) == 1 and oneof.name == f"_{field.name}"


def _present(message: Message, field: FieldDescriptor) -> bool:
    """Set (a field with presence), or always (a proto3 scalar without it: unset reads as its default)."""
    try:
        return message.HasField(field.name)
    except ValueError:  # no presence to ask about
        return True


def _field_classes(message: Message, field: FieldDescriptor) -> Iterator[str]:
    value = getattr(message, field.name)
    if field.is_repeated:
        count = len(value)
        yield "repeated:empty" if count == 0 else ("repeated:many" if count > MANY else "repeated:few")
        element, items = field, list(value)
        if is_map(field):
            element, items = field.message_type.fields_by_name["value"], list(value.values())
        if element.message_type is None:
            items = list(set(items))  # a tiled list repeats a few values: classify each once
        for item in items:
            yield from value_classes(element, item)
        return
    if not _present(message, field):
        if field.message_type is not None:
            yield "message:unset"
        return
    if field.message_type is not None and not value.ListFields():
        yield "message:empty"
    yield from value_classes(field, value)


def message_classes(message: Message) -> set[str]:
    """The bad-input classes of every field of ``message`` (recursively)."""
    descriptor: Descriptor = message.DESCRIPTOR
    found: set[str] = set()
    for field in descriptor.fields:
        found.update(_field_classes(message, field))
        if _is_optional(field):
            found.add("optional:set" if message.HasField(field.name) else "optional:unset")
    for oneof in descriptor.oneofs:
        if len(oneof.fields) == 1 and oneof.name == f"_{oneof.fields[0].name}":
            continue  # a proto3 optional, counted above
        found.add("oneof:set" if message.WhichOneof(oneof.name) else "oneof:unset")
    return found
