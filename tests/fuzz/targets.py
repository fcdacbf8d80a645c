"""Every RPC of the three services, read from the service descriptors, and a raw call to one.

``discover()`` lists each method of each service declared in the services' proto files, so an RPC
added to a proto is fuzzed with no change here. ``invoke`` sends the case's bytes as they are
(identity serializers: no client-side protobuf check stands between the bytes and the server's
deserializer) under a deadline, and returns the status, the raw responses and the time taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf.descriptor import Descriptor, FileDescriptor

from lookahead_rag.v1 import draftcache_pb2, generator_pb2, retriever_pb2

# service (as Pipeline names it) -> the proto file declaring its gRPC service(s)
SERVICE_FILES: dict[str, FileDescriptor] = {
    "retriever": retriever_pb2.DESCRIPTOR,
    "draftcache": draftcache_pb2.DESCRIPTOR,
    "generator": generator_pb2.DESCRIPTOR,
}
CLIENT_MESSAGE_BYTES = 1 << 30  # the client never refuses a size itself: the server's limit is under test


@dataclass(frozen=True)
class Rpc:
    service: str  # "retriever", "draftcache" or "generator": which server answers it
    path: str  # "/lookahead_rag.v1.Retriever/Retrieve"
    input: Descriptor
    output: Descriptor
    client_streaming: bool
    server_streaming: bool

    @property
    def name(self) -> str:
        """``Retriever.Retrieve``."""
        return self.path.lstrip("/").rsplit(".", 1)[-1].replace("/", ".")


def discover(files: dict[str, FileDescriptor] = SERVICE_FILES) -> list[Rpc]:
    """Every method of every service in ``files`` (service name -> proto file)."""
    found: list[Rpc] = []
    for service, file in files.items():
        for grpc_service in file.services_by_name.values():
            for method in grpc_service.methods:
                found.append(Rpc(
                    service, f"/{grpc_service.full_name}/{method.name}", method.input_type, method.output_type,
                    bool(getattr(method, "client_streaming", False)), bool(getattr(method, "server_streaming", False)),
                ))
    return found


@dataclass
class CallResult:
    code: grpc.StatusCode
    details: str
    responses: list[bytes] = field(default_factory=list)
    elapsed_s: float = 0.0


def open_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=[
        ("grpc.max_send_message_length", CLIENT_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", CLIENT_MESSAGE_BYTES),
    ])


def _requests(payload: bytes) -> Iterator[bytes]:
    yield payload


def invoke(channel: grpc.Channel, rpc: Rpc, payload: bytes, deadline_s: float,
           metadata: tuple[tuple[str, str], ...] = ()) -> CallResult:
    """Call ``rpc`` with ``payload`` as the serialized request (or the one message of a client stream)."""
    kinds = {
        (False, False): channel.unary_unary, (False, True): channel.unary_stream,
        (True, False): channel.stream_unary, (True, True): channel.stream_stream,
    }
    call = kinds[rpc.client_streaming, rpc.server_streaming](
        rpc.path, request_serializer=None, response_deserializer=None)
    request: bytes | Iterator[bytes] = _requests(payload) if rpc.client_streaming else payload
    responses: list[bytes] = []
    start = time.monotonic()
    try:
        if rpc.server_streaming:
            for response in call(request, timeout=deadline_s, metadata=metadata):
                responses.append(response)
        else:
            responses.append(call(request, timeout=deadline_s, metadata=metadata))
    except grpc.RpcError as err:
        return CallResult(err.code(), err.details() or "", responses, time.monotonic() - start)  # type: ignore[attr-defined]
    return CallResult(grpc.StatusCode.OK, "", responses, time.monotonic() - start)
