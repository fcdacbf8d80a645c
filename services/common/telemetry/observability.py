"""gRPC observability: the server interceptor (calls counted and timed by method and status code,
a request id and tenant bound for log lines) and the Prometheus ``/metrics`` exporter::

    interceptors = [ObservabilityInterceptor(registry)]  # grpc.aio.server(interceptors=...)
    port = start_metrics_server(9103, registry)          # GET http://host:port/metrics

Metric groups are defined per package (``lookahead_rag.services.common.telemetry.metric_group.MetricGroup``);
state gauges are sampled by ``lookahead_rag.services.common.telemetry.refresher.Refresher``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from lookahead_rag.services.common.rpc.handlers import Behavior, HandlerInterceptor, by_response, relay, rewrap
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER, bind_tenant, request_context
from lookahead_rag.services.common.telemetry.metric_group import LATENCY_BUCKETS, MetricGroup

log = logging.getLogger(__name__)

QUIET_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # probes: access log at DEBUG


class RpcMetrics(MetricGroup):
    """Every gRPC call by full method name and status code (recorded by ObservabilityInterceptor)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        by_call = ("method", "code")
        self.requests = self.counter("rpc_requests", "gRPC calls finished by method and status code", by_call)
        self.latency = self.histogram(
            "rpc_latency_seconds", "gRPC call duration (a stream's whole duration)", LATENCY_BUCKETS, by_call
        )
        self.in_flight = self.gauge("rpc_in_flight", "gRPC calls in progress", ("method",))

    def record(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.requests.labels(method, code.name).inc()
        self.latency.labels(method, code.name).observe(seconds)


# --- the gRPC server interceptor ------------------------------------------------------------------

def _code(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions hand back the integer value
        return next((c for c in grpc.StatusCode if c.value[0] == code), default)
    return default


class _Call:
    """One call's bookkeeping: request context (id, and with ``with_tenant`` the tenant when the request
    has one) for logs, in-flight gauge, count and latency and one access log line at the end."""

    def __init__(self, metrics: RpcMetrics, method: str, context: grpc.aio.ServicerContext,
                 request: Any = None, with_tenant: bool = True) -> None:
        self.metrics, self.method, self.context = metrics, method, context
        metadata = dict(context.invocation_metadata() or ())
        self.scope = request_context(metadata.get(REQUEST_ID_HEADER) or None)
        tenant = getattr(request, "tenant", None) if with_tenant else None
        self.tenant = tenant if isinstance(tenant, str) and tenant else None
        self.start = 0.0

    def __enter__(self) -> None:
        self.scope.__enter__()
        if self.tenant is not None:
            bind_tenant(self.tenant)
        self.metrics.in_flight.labels(self.method).inc()
        self.start = time.perf_counter()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            code = _code(self.context, grpc.StatusCode.OK)
        elif issubclass(exc_type, asyncio.CancelledError | GeneratorExit):
            code = grpc.StatusCode.CANCELLED
        else:  # abort() raises after setting the code; anything else is UNKNOWN to the client
            code = _code(self.context, grpc.StatusCode.UNKNOWN)
        seconds = time.perf_counter() - self.start
        self.metrics.in_flight.labels(self.method).dec()
        self.metrics.record(self.method, code, seconds)
        level = logging.DEBUG if self.method.startswith(QUIET_METHOD_PREFIXES) else logging.INFO
        log.log(level, "%s %s %.1f ms", self.method, code.name, seconds * 1000.0)
        self.scope.__exit__(exc_type, exc, tb)


def _wrap_unary_response(behavior: Behavior, metrics: RpcMetrics, method: str, with_tenant: bool = True
                         ) -> Behavior:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with _Call(metrics, method, context, request, with_tenant):
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

    return wrapper


def _wrap_stream_response(behavior: Behavior, metrics: RpcMetrics, method: str, with_tenant: bool = True
                          ) -> Behavior:
    if inspect.isasyncgenfunction(behavior) or not inspect.iscoroutinefunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with _Call(metrics, method, context, request, with_tenant):
                async for response in relay(behavior(request, context)):
                    yield response

        return stream

    async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:  # context.write() style
        with _Call(metrics, method, context, request, with_tenant):
            await behavior(request, context)

    return writer


def instrument_handler(handler: grpc.RpcMethodHandler, method: str, metrics: RpcMetrics,
                       with_tenant: bool = True) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour wrapped to record ``metrics`` and bind the request context."""
    unary = partial(_wrap_unary_response, metrics=metrics, method=method, with_tenant=with_tenant)
    stream = partial(_wrap_stream_response, metrics=metrics, method=method, with_tenant=with_tenant)
    return rewrap(handler, by_response(unary, stream))


class ObservabilityInterceptor(HandlerInterceptor):
    """For every call of any servicer: count and time it by method and status code, track calls in
    flight, and bind a request id (the ``x-request-id`` metadata, or a new one) for its log lines.

    ``bind_tenant``: bind the request's ``tenant`` field too, as the caller claims it; only where no
    credential is asked for. With auth on, the auth interceptor binds it once the caller may use it
    (``lookahead_rag.services.common.auth.interceptor.server_interceptors`` sets this).
    Calls to unknown methods (UNIMPLEMENTED) are answered by gRPC itself and not counted.
    """

    def __init__(self, registry: CollectorRegistry | None = None, bind_tenant: bool = True) -> None:
        self.metrics = RpcMetrics.of(registry)
        self.bind_tenant = bind_tenant

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return instrument_handler(handler, method, self.metrics, self.bind_tenant)


# --- the /metrics HTTP exporter -------------------------------------------------------------------

_SERVERS: dict[int, Any] = {}


def start_metrics_server(port: int, registry: CollectorRegistry | None = None,
                         host: str = "127.0.0.1") -> int:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; returns the bound port
    (``port=0`` picks a free one). Containers pass host ``0.0.0.0``."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY if registry is None else registry)
    bound = int(server.server_port)
    _SERVERS[bound] = server
    return bound


def stop_metrics_server(port: int) -> None:
    """Stop the exporter started on ``port`` (no-op if there is none)."""
    server = _SERVERS.pop(port, None)
    if server is not None:
        server.shutdown()
        server.server_close()
