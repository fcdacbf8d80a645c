"""The HTTP endpoint's own metrics, and ``/metrics`` on its port.

    app = HttpMetricsMiddleware(MetricsRoute(api, registry, auth), HttpMetrics.of(registry), api.router)

``HttpMetricsMiddleware`` (outermost ASGI layer, added by services.http.server) counts every HTTP
request by route (its path template, never the raw path: bounded labels), method and status,
times it (a streamed reply: until its last byte) and tracks requests in flight. ``MetricsRoute``
answers ``GET /metrics`` with the process's registry, the same one the metrics port serves; with
``[auth] mode = "required"`` it asks for a key with the ``admin`` scope (Prometheus:
``authorization: {credentials_file: ...}``), since the draft cache's gauges name tenants.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.datastructures import Headers
from starlette.routing import Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lookahead_rag.services.common.auth.callers import AUTHORIZATION, Authenticator
from lookahead_rag.services.common.auth.scopes import Scope as AuthScope
from lookahead_rag.services.common.errors import ServiceError
from lookahead_rag.services.common.telemetry.metric_group import LATENCY_BUCKETS, MetricGroup
from lookahead_rag.services.http import errors
from lookahead_rag.services.http.guard import route_of

METRICS_PATH = "/metrics"  # where the registry is served on the API port
UNMATCHED = "unmatched"  # route label of a request that reaches no route (its raw path is never a label)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others are labelled OTHER
OTHER_METHOD = "OTHER"
SCRAPE_METHODS = frozenset({"GET", "HEAD"})
SERVER_ERROR = 500  # status of a request whose application raised before it answered


class HttpMetrics(MetricGroup):
    """The OpenAI-compatible endpoint's requests by route, method and status."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.requests = self.counter("http_requests", "HTTP requests finished by route, method and status",
                                     ("route", "method", "status"))
        self.latency = self.histogram("http_request_duration_seconds",
                                      "HTTP request duration, to the last byte of the reply (a stream's whole length)",
                                      LATENCY_BUCKETS, ("route", "method"))
        self.in_flight = self.gauge("http_requests_in_flight", "HTTP requests in progress", ("route", "method"))

    def record(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)


class HttpMetricsMiddleware:
    """ASGI middleware: every HTTP request counted, timed and tracked in flight (``HttpMetrics``)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, router: Router) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router

    def route(self, scope: Scope) -> str:
        if scope.get("path") == METRICS_PATH:
            return METRICS_PATH
        return route_of(self.router, scope) or UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.route(scope)
        method = str(scope.get("method", ""))
        method = method if method in METHODS else OTHER_METHOD
        status: int | None = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        gauge = self.metrics.in_flight.labels(route, method)
        gauge.inc()
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            status = errors.CLIENT_CLOSED if status is None else status
            raise
        except Exception:
            status = SERVER_ERROR if status is None else status
            raise
        finally:
            gauge.dec()
            self.metrics.record(route, method, SERVER_ERROR if status is None else status,
                                time.perf_counter() - start)


class MetricsRoute:
    """ASGI: ``GET /metrics`` -> the registry in Prometheus' text format; anything else -> ``app``."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry, auth: Authenticator | None = None) -> None:
        self.app = app
        self.exporter = make_asgi_app(registry)
        self.auth = auth if auth is not None and auth.required else None  # None: open, as the metrics port is

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != METRICS_PATH or scope.get("method") not in SCRAPE_METHODS:
            await self.app(scope, receive, send)
            return
        if self.auth is not None:
            try:
                principal = self.auth.authenticate(Headers(scope=scope).get(AUTHORIZATION))
                Authenticator.permit(principal, AuthScope.ADMIN, f"GET {METRICS_PATH}")
            except ServiceError as exc:
                await errors.error_response(exc)(scope, receive, send)
                return
        await self.exporter(scope, receive, send)
