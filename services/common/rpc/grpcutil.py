"""gRPC plumbing shared by the services: server start/stop with health and reflection, channels.

    server, port = await start_server(
        [(retriever_pb2_grpc.add_RetrieverServicer_to_server, servicer)],
        [retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name],
        port=0, interceptors=[ObservabilityInterceptor(registry)],
    )
    ...
    await stop_server(server, grace_s=5.0)

Every listed service (and the overall "" service) reports SERVING through grpc.health.v1 while the
server runs and NOT_SERVING from the moment shutdown starts; reflection lists the services.

Shutdown (``stop_server``, what SIGTERM runs through services.common.service.graceful_stop) has two
phases: draining, ``drain_s`` long, in which health reports NOT_SERVING (the pod's readiness fails,
clients' health-checking balancers move to other replicas) but calls are still served, so a
client that has not noticed yet loses nothing; then the server refuses new calls (a client's
retry policy sends them to another replica) and in-flight calls get ``grace_s`` to finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lookahead_rag.services.common.auth.tls import TlsSettings, channel_credentials, channel_options
from lookahead_rag.services.common.rpc.channel_config import ChannelSettings
from lookahead_rag.services.common.rpc.channel_config import channel_options as balancing_options
from lookahead_rag.services.common.rpc.decode_guard import DecodeGuard
from lookahead_rag.services.common.telemetry import tracing

log = logging.getLogger(__name__)

MS_PER_S = 1000

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # ingest batches and long prompt id lists fit
DEFAULT_HOST = "127.0.0.1"
OVERALL = health.OVERALL_HEALTH  # "" : the whole server
ANY_INTERFACE = frozenset({"", "0.0.0.0", "::", "[::]"})  # bind addresses a local client reaches via loopback

AddFn = Callable[[Any, grpc.aio.Server], None]

# server -> its health servicer, so stop_server can flip every service to NOT_SERVING first.
_HEALTH: weakref.WeakKeyDictionary[grpc.aio.Server, health.aio.HealthServicer] = weakref.WeakKeyDictionary()
# server -> time.monotonic() when it started draining (health NOT_SERVING, calls still served).
_DRAINING: weakref.WeakKeyDictionary[grpc.aio.Server, float] = weakref.WeakKeyDictionary()


def message_size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel/server options raising both message size limits to ``max_message_bytes``."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def connection_age_options(max_age_s: float) -> list[tuple[str, int]]:
    """Server options closing a client connection after ``max_age_s`` (gRPC adds +-10% jitter) with a GOAWAY:
    the client opens a new one for its next calls, re-resolving its target (new replicas join a
    round_robin), while calls in flight on the old one finish (no age grace is set: gRPC waits for them).
    0: connections live as long as the client keeps them."""
    if max_age_s <= 0:
        return []
    return [("grpc.max_connection_age_ms", max(1, round(max_age_s * MS_PER_S)))]


async def start_server(
    servicers: Sequence[tuple[AddFn, Any]],
    service_names: Sequence[str],
    port: int = 0,
    host: str = DEFAULT_HOST,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_concurrent_rpcs: int | None = None,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    max_connection_age_s: float = 0.0,
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the servicers, health checking and reflection; return (server, port).

    ``port=0`` binds a free port (tests); ``max_concurrent_rpcs`` makes the server answer
    RESOURCE_EXHAUSTED at once beyond that many calls in flight instead of queueing them;
    ``interceptors`` (e.g. services.common.telemetry.observability.ObservabilityInterceptor) see every call;
    ``credentials`` (services.common.auth.tls.server_credentials) serve TLS, None plaintext;
    ``max_connection_age_s`` > 0 recycles each client connection that old (``connection_age_options``).
    """
    server = grpc.aio.server(
        options=[*message_size_options(max_message_bytes), *connection_age_options(max_connection_age_s)],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        # the trace span (tracing on) inside the given ones (auth: no span for a refused caller); innermost:
        # undecodable bytes -> INVALID_ARGUMENT, not UNKNOWN
        interceptors=[*interceptors, *tracing.server_interceptors(), DecodeGuard()],
    )
    for add_fn, servicer in servicers:
        add_fn(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    address = f"{host}:{port}"
    secure = credentials is not None
    bound = server.add_secure_port(address, credentials) if secure else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {address}")
    await server.start()
    for name in [*service_names, OVERALL]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _HEALTH[server] = health_servicer
    log.info("gRPC server on %s:%d (%s) serving %s", host, bound, "TLS" if secure else "plaintext",
             ", ".join(service_names))
    return server, bound


async def start_draining(server: grpc.aio.Server) -> None:
    """Health goes NOT_SERVING for good (every service, and the server); calls are still served."""
    if server in _DRAINING:
        return
    _DRAINING[server] = time.monotonic()
    health_servicer = _HEALTH.get(server)
    if health_servicer is not None:
        await health_servicer.enter_graceful_shutdown()


async def stop_server(server: grpc.aio.Server, grace_s: float, drain_s: float = 0.0) -> None:
    """Graceful shutdown: health goes NOT_SERVING (if ``start_draining`` has not done it), calls are
    still served until ``drain_s`` has passed since then, then new calls are refused and in-flight
    calls get ``grace_s``."""
    await start_draining(server)
    remaining = drain_s - (time.monotonic() - _DRAINING.pop(server))
    if remaining > 0:
        log.info("draining for %.1f s more before refusing new calls", remaining)
        await asyncio.sleep(remaining)
    _HEALTH.pop(server, None)
    await server.stop(grace_s)


def local_target(host: str, port: int) -> str:
    """HOST:PORT a client in this process dials to reach a server bound to ``host``:``port``."""
    if host in ANY_INTERFACE:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{port}"


def open_channel(target: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 tls: TlsSettings | None = None, channels: ChannelSettings | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to ``target`` (HOST:PORT, or ``dns:///HOST:PORT`` / ``ipv4:///A:P,B:P`` for
    several replicas) with the same message size limits: TLS when ``tls`` turns it on for clients
    (services.common.auth.tls), else plaintext; load balancing and retries on UNAVAILABLE from ``channels``
    (services.common.rpc.channel_config; None: its defaults)."""
    options = [*message_size_options(max_message_bytes), *balancing_options(channels)]
    credentials = channel_credentials(tls)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=tracing.client_interceptors())
    return grpc.aio.secure_channel(target, credentials, options=[*options, *channel_options(tls)],
                                   interceptors=tracing.client_interceptors())  # [] unless tracing is on
