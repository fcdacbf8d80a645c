"""``Service``: what each ``build_<service>`` returns, and the one way to serve it over gRPC.

A builder loads its service's domain object (``core``), subscribes it to the bus and hands back
its servicers, its metric refresh jobs and its start and stop steps; it opens no port. The
assembly (``lookahead_rag.services.app``) then either calls ``core`` in-process or serves the servicers::

    service = await build_retriever(settings, limits, bus, registry)
    await service.start()                      # background tasks (e.g. periodic snapshots)
    port = await service.serve(port=0)         # gRPC + health + reflection + the interceptors
    ...
    await service.stop()                       # graceful: server first, then the service's own closers

SIGTERM (``lookahead-rag serve``) runs ``graceful_stop``: every server drains at once (health
NOT_SERVING, calls still served for the longest ``drain_s``), then the process stops as above.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from lookahead_rag.services.common.rpc.grpcutil import (
    DEFAULT_MAX_MESSAGE_BYTES,
    AddFn,
    start_draining,
    start_server,
    stop_server,
)
from lookahead_rag.services.common.settings import ServerSettings

T = TypeVar("T")
Job = Callable[[], object]  # a cheap metric sampler run by the Refresher
Step = Callable[[], Awaitable[Any]]  # one start or stop step
Loop = Callable[[], Coroutine[Any, Any, None]]  # a background task that runs until cancelled


@dataclass
class Service(Generic[T]):
    """One built service: its domain object, its gRPC servicers and its lifecycle steps."""

    name: str  # "retriever", "draftcache" or "generator"
    core: T  # the domain object in-process callers use (RetrieverCore, DraftCacheStore, GeneratorCore)
    settings: ServerSettings  # host, port, grace
    handlers: Sequence[tuple[AddFn, Any]]  # (add_XServicer_to_server, servicer) pairs
    service_names: Sequence[str]  # full gRPC service names, for health and reflection
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # largest gRPC message sent or received
    jobs: list[Job] = field(default_factory=list)  # metric samplers for the Refresher
    loops: list[Loop] = field(default_factory=list)  # background tasks start() runs until stop()
    closers: list[Step] = field(default_factory=list)  # run in order by stop(), after the server
    server: grpc.aio.Server | None = None  # set by serve()
    port: int | None = None  # the bound gRPC port, set by serve()
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    async def start(self) -> None:
        """Start the background tasks."""
        self._tasks = [asyncio.create_task(loop(), name=f"{self.name}-{i}") for i, loop in enumerate(self.loops)]

    async def serve(self, port: int | None = None, host: str | None = None,
                    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
                    credentials: grpc.ServerCredentials | None = None) -> int:
        """Serve the servicers (health and reflection on) on ``host:port`` (default: the settings';
        port 0 = any free port), over TLS with ``credentials`` (services.common.auth.tls.server_credentials);
        returns the bound port."""
        self.server, self.port = await start_server(
            list(self.handlers), list(self.service_names),
            port=self.settings.port if port is None else port,
            host=self.settings.host if host is None else host,
            max_message_bytes=self.max_message_bytes, interceptors=interceptors, credentials=credentials,
            max_connection_age_s=self.settings.max_connection_age_s,
        )
        return self.port

    async def start_draining(self) -> None:
        """Health reports NOT_SERVING from now on; calls are still served until ``stop_serving``."""
        if self.server is not None:
            await start_draining(self.server)

    async def stop_serving(self, grace_s: float | None = None) -> None:
        """Graceful: what is left of ``drain_s`` since draining started (health NOT_SERVING, calls
        served), then the server finishes in-flight calls within the grace (the settings' by default)."""
        if self.server is not None:
            await stop_server(self.server, self.settings.shutdown_grace_s if grace_s is None else grace_s,
                              self.settings.drain_s)
            self.server = None

    async def close(self) -> None:
        """Stop the background tasks, then run the closers in order (save state, free the model)."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for close in self.closers:
            await close()

    async def stop(self, grace_s: float | None = None) -> None:
        """``stop_serving`` then ``close`` (a pipeline drains its bus in between)."""
        await self.stop_serving(grace_s)
        await self.close()


async def drain(services: Sequence[Service[Any]]) -> None:
    """Every server's health reports NOT_SERVING at once; they keep serving for the longest ``drain_s``
    (readiness fails and balancers move away meanwhile, so no caller meets a refused call)."""
    serving = [service for service in services if service.server is not None]
    for service in serving:
        await service.start_draining()
    await asyncio.sleep(max((service.settings.drain_s for service in serving), default=0.0))


async def graceful_stop(services: Sequence[Service[Any]], stop: Step) -> None:
    """What SIGINT/SIGTERM run: ``drain`` the servers, then ``stop`` (each server refuses new calls and
    gives in-flight ones its ``shutdown_grace_s``; then the bus drains and state is saved)."""
    await drain(services)
    await stop()
