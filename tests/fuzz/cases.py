"""One fuzz case: the bytes sent as a request, its bad-input classes and where it came from.

``case_strategy`` mixes schema-valid messages (four parts in six: they pass the deserializer and
reach the service's own checks) with raw wire bytes (one part each: damaged/mutated encodings and
random bytes, ``tests.fuzz.wire``). ``fixed_cases`` are the few cases every RPC gets once: the
empty request, one just over the server's message size limit, and deep group nesting.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from tests.fuzz.classes import message_classes
from tests.fuzz.messages import messages
from tests.fuzz.values import FuzzDictionary
from tests.fuzz.wire import (
    END_GROUP,
    MAX_FIELD_NUMBER,
    NESTING,
    START_GROUP,
    delimited,
    key,
    random_bytes,
    wire_cases,
)

MESSAGE, WIRE, FIXED = "message", "wire", "fixed"
MESSAGE_SHARES = 4  # of six: schema-valid messages (the other two: damaged wire bytes, random bytes)


@dataclass(frozen=True)
class Case:
    payload: bytes
    classes: frozenset[str]
    origin: str  # MESSAGE, WIRE or FIXED


def case_strategy(descriptor: Descriptor, words: FuzzDictionary) -> st.SearchStrategy[Case]:
    """Requests of ``descriptor``'s type: schema-valid messages and raw wire bytes."""
    # one_of drops a repeated branch, so each share of valid messages is a strategy object of its own
    valid = [messages(descriptor, words).map(_as_case) for _ in range(MESSAGE_SHARES)]
    raw = wire_cases(descriptor, words).map(lambda e: Case(e.data, e.classes, WIRE))
    noise = random_bytes().map(lambda e: Case(e.data, e.classes, WIRE))
    return st.one_of(*valid, raw, noise)


def _as_case(message: Message) -> Case:
    return Case(message.SerializeToString(), frozenset(message_classes(message)), MESSAGE)


def fixed_cases(max_message_bytes: int) -> list[Case]:
    """The empty request, one field of ``max_message_bytes`` + 1 bytes (over the server's limit),
    and groups nested far deeper than any parser allows."""
    unknown = MAX_FIELD_NUMBER  # no message here has this field
    levels = NESTING[1]
    deep = key(unknown, START_GROUP) * levels + key(unknown, END_GROUP) * levels
    return [
        Case(b"", frozenset({"fixed:empty"}), FIXED),
        Case(delimited(unknown, b"\x00" * (max_message_bytes + 1)), frozenset({"fixed:oversize"}), FIXED),
        Case(deep, frozenset({"fixed:deep-nesting"}), FIXED),
    ]
