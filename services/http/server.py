"""``HttpServer``: uvicorn in-process, on the running event loop, beside the gRPC servers.

    http = await HttpServer.start(generator, settings.http, port=0)   # port: None = the settings'
    http.port                                                      # the bound port
    GET /metrics                                                   # the same registry as the metrics port
    await http.stop()                                              # graceful, within shutdown_grace_s

We bind the socket ourselves (a port in use raises OSError here, where uvicorn would call
sys.exit) and leave the process's signal handlers alone (``lookahead-rag serve`` owns them).
Bound to loopback with auth off (``demo --serve``), it serves only a Host naming loopback or
``[http] allowed_hosts`` (services.http.origin: DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from lookahead_rag.services.common.auth.tls import TlsSettings, is_loopback, uvicorn_ssl
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.http.ingest import Ingest
from lookahead_rag.services.http.metrics import HttpMetrics, HttpMetricsMiddleware, MetricsRoute
from lookahead_rag.services.http.origin import HostGuard
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.settings import HttpSettings

if TYPE_CHECKING:
    from lookahead_rag.services.common.auth.callers import Authenticator
    from lookahead_rag.services.generator.core import GeneratorCore

log = logging.getLogger(__name__)

STARTUP_POLL_S = 0.01  # how often start() looks whether uvicorn is listening


class _Server(uvicorn.Server):
    """uvicorn's server without its SIGINT/SIGTERM handlers: the process's owner stops us."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: any free port), IPv6 when the host is an IPv6 address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def guarded(app: ASGIApp, front: Frontend) -> ASGIApp:
    """``app`` behind the Host check when the endpoint binds loopback with auth off (services.http.origin:
    a rebinding page's requests carry its own Host); as it is otherwise (auth decides who is served)."""
    if front.auth is None and is_loopback(front.settings.host):
        return HostGuard(app, front.settings.allowed_hosts)
    return app


def serving_app(front: Frontend, registry: CollectorRegistry | None = None) -> ASGIApp:
    """The API (``make_app``; its server spans when tracing is on) behind ``GET /metrics`` and the
    request metrics, both on ``registry`` (None: prometheus_client's default)."""
    api = make_app(front)
    tracing.instrument_app(api)
    metrics = HttpMetrics.of(registry)
    return HttpMetricsMiddleware(MetricsRoute(api, metrics.registry, front.auth), metrics, api.router)


class HttpServer:
    """The OpenAI-compatible endpoint served over one generator."""

    def __init__(self, front: Frontend, server: uvicorn.Server, task: asyncio.Task[None], port: int) -> None:
        self.front = front
        self.server = server
        self.task = task
        self.port = port

    @classmethod
    async def start(cls, generator: GeneratorCore, settings: HttpSettings, port: int | None = None,
                    tls: TlsSettings | None = None, auth: Authenticator | None = None,
                    registry: CollectorRegistry | None = None, documents: Ingest | None = None) -> HttpServer:
        """Listen on ``settings.host`` and ``port`` (None: the settings'; 0: any free port); HTTPS with
        ``tls``'s server certificate when it has one (client certificates required with its client_ca_file);
        ``auth`` (``[auth] mode = "required"``) asks every request for an API key of its tenant;
        ``registry`` is served at /metrics and holds the HTTP request metrics (None: the default one);
        ``documents`` is how ``POST /v1/documents`` reaches a retriever (None: that route is a 503)."""
        sock = bind_socket(settings.host, settings.port if port is None else port)
        bound = int(sock.getsockname()[1])
        front = Frontend(generator, settings, auth, documents)
        app = guarded(serving_app(front, registry), front)
        config = uvicorn.Config(app, host=settings.host, port=bound, lifespan="off",
                                log_config=None, access_log=settings.access_log, ws="none",
                                timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
                                **uvicorn_ssl(tls))
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="http-server")
        while not server.started and not task.done():
            await asyncio.sleep(STARTUP_POLL_S)
        if task.done():
            sock.close()
            task.result()  # raises what stopped it
            raise RuntimeError("the HTTP server stopped while starting")
        front.serving = True
        scheme = "https" if uvicorn_ssl(tls) else "http"
        log.info("OpenAI-compatible endpoint on %s://%s:%d/v1", scheme, settings.host, bound)
        return cls(front, server, task, bound)

    @property
    def serving(self) -> bool:
        return self.front.serving

    async def stop(self) -> None:
        """Graceful: refuse new requests, let in-flight ones finish within shutdown_grace_s, then cancel them."""
        self.front.serving = False
        self.server.should_exit = True
        await self.task
