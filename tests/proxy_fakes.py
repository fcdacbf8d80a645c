"""Small stand-in replicas for the real proxy (deploy/haproxy/haproxy.cfg): each a gRPC door with the
standard health service and a server-streaming method that holds its call open until released, and an
HTTP door with ``/health`` and one route. No model, so the proxy's own rules (tenant limits, bounded
loads, health checks) are what a test sees.

``require_haproxy()`` skips a test when haproxy is not installed, with the command that installs it,
unless ``LAR_PROXY_TESTS=required`` (CI: .ci/run installs it), where a missing proxy fails the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lookahead_rag.bench.haproxy_proxy import HaproxyMissingError, haproxy_binary

HOST = "127.0.0.1"
REQUIRED = "LAR_PROXY_TESTS"  # "required": a missing haproxy fails the test (CI) instead of skipping it
HOLD_METHOD = "/test.Hold/Stream"  # the stand-in's one gRPC method: its name, then held until released
HTTP_ROUTE = "/v1/name"  # the stand-in's HTTP route: its name as JSON


def require_haproxy() -> None:
    """Skip (or, with LAR_PROXY_TESTS=required, fail) when the proxy is not installed."""
    try:
        haproxy_binary()
    except HaproxyMissingError as exc:
        if os.environ.get(REQUIRED) == "required":
            pytest.fail(f"{REQUIRED}=required and {exc}")
        pytest.skip(f"the proxy is not installed: {exc}")


def _http_handler(name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /health and HTTP_ROUTE alike: 200 and the replica's name
            body = json.dumps({"name": name}).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@dataclass
class FakeReplica:
    """One stand-in replica on the running event loop (start / stop)."""

    name: str
    in_flight: int = 0  # calls held open now
    release: asyncio.Event = field(default_factory=asyncio.Event)  # set: every held call ends
    grpc_address: str = ""
    http_address: str = ""

    async def _hold(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.in_flight += 1
        try:
            yield self.name.encode()
            if request != b"now":  # b"now": answer and end at once
                await self.release.wait()
        finally:
            self.in_flight -= 1

    async def start(self) -> None:
        self._server = grpc.aio.server()
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        service, method = HOLD_METHOD.strip("/").split("/")
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            service, {method: grpc.unary_stream_rpc_method_handler(self._hold)})])
        self.grpc_address = f"{HOST}:{self._server.add_insecure_port(f'{HOST}:0')}"
        await self._server.start()
        self._http = ThreadingHTTPServer((HOST, 0), _http_handler(self.name))
        self.http_address = f"{HOST}:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    async def drain(self) -> None:
        """Health NOT_SERVING from now on (a replica's SIGTERM); calls are still served."""
        await self._health.enter_graceful_shutdown()

    async def stop(self) -> None:
        self.release.set()
        await self._server.stop(grace=None)
        self._http.shutdown()
        self._http.server_close()


@asynccontextmanager
async def fake_replicas(names: tuple[str, ...] = ("r1", "r2")) -> AsyncIterator[list[FakeReplica]]:
    """Started stand-ins named ``names`` (skipping the test, via require_haproxy, without a proxy)."""
    require_haproxy()
    fakes = [FakeReplica(name) for name in names]
    for fake in fakes:
        await fake.start()
    try:
        yield fakes
    finally:
        for fake in fakes:
            await fake.stop()


async def hold(channel: grpc.aio.Channel, tenant: str, now: bool = False,
               key: str | None = None) -> tuple[str, grpc.aio.Call | None]:
    """Open one call for ``tenant`` (sending ``authorization: Bearer <key>`` when given): (the replica
    that took it, the call, still open unless ``now``), or (the status code's name, None) when refused."""
    metadata = [("x-tenant", tenant)] + ([("authorization", f"Bearer {key}")] if key else [])
    call = channel.unary_stream(HOLD_METHOD)(b"now" if now else b"hold", metadata=metadata)
    try:
        async for first in call:
            return first.decode(), call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, None
    return "ended", None
