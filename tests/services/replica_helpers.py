"""A minimal gRPC service for channel and rollout tests: replicas that say who they are, stream
slowly, or fail on purpose; served through the real Service / start_server plumbing."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from lookahead_rag.services.common.service import Service
from lookahead_rag.services.common.settings import ServerSettings

SERVICE = "test.Echo"  # full gRPC service name (health and reflection list it)
WHO = f"/{SERVICE}/Who"  # unary: the replica's name
COUNT = f"/{SERVICE}/Count"  # server stream: n messages, one every STREAM_PAUSE_S
STREAM_PAUSE_S = 0.05  # pause between two streamed messages


def _identity(data: bytes) -> bytes:
    return data


@dataclass
class Replica:
    """One replica's servicer: counts what it served; fails the first ``fail_first`` calls UNAVAILABLE."""

    name: str
    fail_first: int = 0  # calls answered UNAVAILABLE before it starts answering
    served: Counter[str] = field(default_factory=Counter)  # method -> calls answered OK
    failed: int = 0  # calls it failed on purpose
    peers: set[str] = field(default_factory=set)  # the client connections (address:port) its Who calls came on

    async def who(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if self.failed < self.fail_first:
            self.failed += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} fails on purpose")
        self.served["Who"] += 1
        self.peers.add(context.peer())
        return self.name.encode()

    async def count(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(request.decode())):
            await asyncio.sleep(STREAM_PAUSE_S)
            yield f"{self.name}:{i}".encode()
        self.served["Count"] += 1

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Who": grpc.unary_unary_rpc_method_handler(self.who, _identity, _identity),
            "Count": grpc.unary_stream_rpc_method_handler(self.count, _identity, _identity),
        })


def add_replica(replica: Replica, server: grpc.aio.Server) -> None:
    """The AddFn of Service.handlers."""
    server.add_generic_rpc_handlers((replica.handler(),))


def replica_service(replica: Replica, **settings: Any) -> Service[Replica]:
    """``replica`` as a Service on loopback, any free port (``settings``: drain_s, shutdown_grace_s, ...)."""
    own = ServerSettings.model_construct(**(ServerSettings.model_construct().model_dump() | settings))
    return Service(name=replica.name, core=replica, settings=own, handlers=[(add_replica, replica)],
                   service_names=[SERVICE])


def who(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return channel.unary_unary(WHO, request_serializer=_identity, response_deserializer=_identity)


def count(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return channel.unary_stream(COUNT, request_serializer=_identity, response_deserializer=_identity)


def ipv4_target(*ports: int) -> str:
    """One target listing every replica (what a headless Service's DNS name resolves to)."""
    return "ipv4:///" + ",".join(f"127.0.0.1:{port}" for port in ports)
