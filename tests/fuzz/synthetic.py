"""A proto file made at run time with every kind of field, for the fuzzer's own tests: the strategies
are shown to reach every bad-input class on it, and a service nobody wrote code for is discovered.

    file = synthetic_file()          # FileDescriptor of "fuzz_selftest.proto"
    everything = file.message_types_by_name["Everything"]
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor

FDP = descriptor_pb2.FieldDescriptorProto
PACKAGE = "fuzz.selftest"
SCALARS = [  # (name, type) of the singular scalar fields, numbered from 1
    ("d", FDP.TYPE_DOUBLE), ("f", FDP.TYPE_FLOAT), ("i64", FDP.TYPE_INT64), ("u64", FDP.TYPE_UINT64),
    ("i32", FDP.TYPE_INT32), ("fx64", FDP.TYPE_FIXED64), ("fx32", FDP.TYPE_FIXED32), ("b", FDP.TYPE_BOOL),
    ("s", FDP.TYPE_STRING), ("by", FDP.TYPE_BYTES), ("u32", FDP.TYPE_UINT32), ("sf32", FDP.TYPE_SFIXED32),
    ("sf64", FDP.TYPE_SFIXED64), ("si32", FDP.TYPE_SINT32), ("si64", FDP.TYPE_SINT64),
]


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int,
           label: int = FDP.LABEL_OPTIONAL, type_name: str = "") -> descriptor_pb2.FieldDescriptorProto:
    field = message.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        field.type_name = f".{PACKAGE}.{type_name}"
    return field


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="fuzz_selftest.proto", package=PACKAGE, syntax="proto3")
    color = proto.enum_type.add(name="Color")
    color.value.add(name="COLOR_UNSPECIFIED", number=0)
    color.value.add(name="RED", number=1)
    inner = proto.message_type.add(name="Inner")
    _field(inner, "name", 1, FDP.TYPE_STRING)
    _field(inner, "ids", 2, FDP.TYPE_UINT32, FDP.LABEL_REPEATED)
    every = proto.message_type.add(name="Everything")
    for number, (name, kind) in enumerate(SCALARS, start=1):
        _field(every, name, number, kind)
    n = len(SCALARS)
    _field(every, "color", n + 1, FDP.TYPE_ENUM, type_name="Color")
    _field(every, "inner", n + 2, FDP.TYPE_MESSAGE, type_name="Inner")
    _field(every, "rs", n + 3, FDP.TYPE_STRING, FDP.LABEL_REPEATED)
    _field(every, "rd", n + 4, FDP.TYPE_DOUBLE, FDP.LABEL_REPEATED)
    _field(every, "rinner", n + 5, FDP.TYPE_MESSAGE, FDP.LABEL_REPEATED, "Inner")
    entry = every.nested_type.add(name="ByNameEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, FDP.TYPE_STRING)
    _field(entry, "value", 2, FDP.TYPE_MESSAGE, type_name="Inner")
    _field(every, "by_name", n + 6, FDP.TYPE_MESSAGE, FDP.LABEL_REPEATED, "Everything.ByNameEntry")
    every.oneof_decl.add(name="choice")
    _field(every, "text", n + 7, FDP.TYPE_STRING).oneof_index = 0
    _field(every, "item", n + 8, FDP.TYPE_MESSAGE, type_name="Inner").oneof_index = 0
    every.oneof_decl.add(name="_seed")  # a proto3 optional: its own synthetic oneof
    seed = _field(every, "seed", n + 9, FDP.TYPE_UINT64)
    seed.oneof_index, seed.proto3_optional = 1, True
    service = proto.service.add(name="Everywhere")
    service.method.add(name="Call", input_type=f".{PACKAGE}.Everything", output_type=f".{PACKAGE}.Inner")
    service.method.add(name="Watch", input_type=f".{PACKAGE}.Everything", output_type=f".{PACKAGE}.Inner",
                       server_streaming=True)
    return proto


@functools.cache
def synthetic_file() -> FileDescriptor:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(_file_proto().SerializeToString())
    return pool.FindFileByName("fuzz_selftest.proto")
