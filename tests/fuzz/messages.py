"""A hypothesis strategy for any protobuf message, built from its descriptor alone.

    strategy = messages(retriever_pb2.RetrieveRequest.DESCRIPTOR, FuzzDictionary.of(["acme"]))

Every field outside a oneof is set or left unset; each oneof (a proto3 ``optional`` field is a
oneof of one) gets none or one of its members; repeated fields get a few elements or many (a short
draw tiled, so the draw stays small); maps get a few entries; nested messages recurse down to
``MAX_DEPTH`` (deeper ones stay unset, so recursive types terminate). Values come from
``tests.fuzz.values`` by field type. A new field or message in the protos is fuzzed with no change here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from tests.fuzz.values import FuzzDictionary, scalar_values

MAX_DEPTH = 4  # nested messages below this depth stay unset
FEW = 6  # a "few" repeated elements or map entries
MANY_NUMBERS = 20_000  # most elements of a tiled repeated number field
MANY_ITEMS = 32  # most elements of a tiled repeated string, bytes or message field
DENSITIES = (5, 10, 8, 3, 1)  # tenths of a message's fields that are set (drawn per message)
TENTHS = 10
TILE_PIECE = 3  # a tiled list repeats a draw of at most this many elements

F = FieldDescriptor
NO_WORDS = FuzzDictionary()


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _tile(piece: list[Any], size: int) -> list[Any]:
    return (piece * (size // len(piece) + 1))[:size]


def repeated(element: st.SearchStrategy[Any], many: int) -> st.SearchStrategy[list[Any]]:
    """0..FEW elements, or FEW+1..many (a short draw tiled)."""
    tiled = st.builds(_tile, st.lists(element, min_size=1, max_size=TILE_PIECE), st.integers(FEW + 1, many))
    return st.one_of(st.lists(element, max_size=FEW), tiled)


def _reachable(field: FieldDescriptor, depth: int) -> bool:
    return field.message_type is None or depth < MAX_DEPTH


def field_values(field: FieldDescriptor, words: FuzzDictionary, depth: int) -> st.SearchStrategy[Any]:
    """Values for one field: a scalar or message, a list for a repeated field, a dict for a map."""
    if is_map(field):
        entry = field.message_type
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return st.dictionaries(field_values(key, words, depth), field_values(value, words, depth + 1), max_size=FEW)
    single = messages(field.message_type, words, depth + 1) if field.message_type else scalar_values(field, words)
    if not field.is_repeated:
        return single
    bulky = field.message_type is not None or field.type in (F.TYPE_STRING, F.TYPE_BYTES)
    return repeated(single, MANY_ITEMS if bulky else MANY_NUMBERS)


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    name = field.name
    if is_map(field):
        target = getattr(message, name)
        for k, v in value.items():
            if isinstance(v, Message):
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif field.is_repeated:
        target = getattr(message, name)
        if field.message_type is not None:
            for item in value:
                target.add().CopyFrom(item)
        else:
            target.extend(value)
    elif field.message_type is not None:
        sub = getattr(message, name)
        sub.SetInParent()  # set, even when empty: presence is a case of its own
        sub.MergeFrom(value)
    else:
        setattr(message, name, value)


def build(cls: type[Message], descriptor: Descriptor, values: Mapping[str, Any]) -> Message:
    """A message of ``cls`` with ``values`` (field name -> value) set."""
    message = cls()
    for name, value in values.items():
        try:
            _set(message, descriptor.fields_by_name[name], value)
        except ValueError:  # a closed (proto2) enum refuses unknown numbers: leave the field unset
            message.ClearField(name)
    return message


def _merged(parts: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part)
    return out


@st.composite
def _some_of(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Some of ``fields`` set: first a density, then each field with that chance. Sparse messages
    (a tenant and a prompt, nothing else) pass validation far more often than half-full ones, so
    the code behind it is reached; dense ones stack many bad values in one request."""
    density = draw(st.sampled_from(DENSITIES))
    return {name: draw(values) for name, values in fields.items() if draw(st.integers(0, TENTHS - 1)) < density}


@functools.cache
def messages(descriptor: Descriptor, words: FuzzDictionary = NO_WORDS, depth: int = 0
             ) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type with random fields set (see the module doc)."""
    cls = GetMessageClass(descriptor)
    plain = {
        f.name: field_values(f, words, depth)
        for f in descriptor.fields
        if f.containing_oneof is None and _reachable(f, depth)
    }
    parts: list[st.SearchStrategy[dict[str, Any]]] = [_some_of(plain)]
    for oneof in descriptor.oneofs:
        members = [
            st.fixed_dictionaries({f.name: field_values(f, words, depth)}) for f in oneof.fields if _reachable(f, depth)
        ]
        parts.append(st.one_of(*members, st.just({})))  # a member first: some oneofs must be set to pass
    return st.tuples(*parts).map(lambda drawn: build(cls, descriptor, _merged(drawn)))
