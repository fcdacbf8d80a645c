"""OpenTelemetry traces: one trace per request across HTTP -> generator -> retriever -> draft cache.

Off unless an OTLP endpoint is configured (``[tracing] otlp_endpoint``, env ``LAR_TRACING_OTLP_ENDPOINT``,
or OTel's own ``OTEL_EXPORTER_OTLP_ENDPOINT``). Off, nothing is installed: the interceptor lists are
empty, the FastAPI app is not wrapped, ``request_spans`` returns at once, and the OTel SDK and the
instrumentation packages are never imported. On, once per process::

    setup(settings.tracing, ("generator",))   # services.app.Pipeline.start: a TracerProvider, OTLP/gRPC export
    grpc.aio.server(interceptors=[*server_interceptors(), ...])   # services.common.rpc.grpcutil.start_server
    grpc.aio.insecure_channel(target, interceptors=client_interceptors())   # grpcutil.open_channel
    instrument_app(app)                       # services.http.server: FastAPI's server spans
    shutdown()                                # lookahead-rag serve, at exit: flush what is batched

The gRPC and HTTP spans come from the OTel instrumentation packages, which carry the W3C
``traceparent`` in gRPC metadata. Callers are not trusted before they are authenticated, nor after: the
server spans start inside the auth checks (``grpcutil.start_server`` puts the OTel interceptor after the
given ones; ``instrument_app`` puts the ASGI middleware inside the request guard), sampling is the
operator's ``sample_ratio`` by trace id whatever the caller's sampled flag says (``sampler``), and the
process's propagator (``EdgePropagator``) reads and writes ``traceparent`` only: a caller's ``tracestate``
and ``baggage`` are dropped where they come in, so they never reach the outbox, Kafka headers or dead
letters; the engine's own steps (queue, prefill, decode) are recorded by
``request_spans`` once a request ends. The provider is also the global one, so code that only uses
the OTel API (``opentelemetry.trace.get_tracer``, ``opentelemetry.propagate.inject/extract``, e.g. the
Kafka records' headers in services/events) joins the same traces. Tests install their own provider
(an in-memory exporter) with ``install(provider, set_global=False)`` and ``uninstall()`` it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import CarrierT, Getter, default_getter
from opentelemetry.trace import NonRecordingSpan, SpanContext, Tracer, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from lookahead_rag.services.common.settings import TracingSettings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

log = logging.getLogger(__name__)

TRACER_NAME = "lookahead_rag"  # instrumentation scope of our own spans
EVENTS_TRACER = "lookahead_rag.events"  # instrumentation scope of the Kafka consumers' spans
NS_PER_S = 1_000_000_000
UNTRACED_HTTP_PATHS = "health,metrics"  # FastAPI: probes and scrapes start no trace (OTel's excluded_urls)
UNTRACED_GRPC_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")  # gRPC services whose calls start no span
QUEUE, PREFILL, DECODE = "generator.queue", "generator.prefill", "generator.decode"  # the engine's spans

_lock = threading.Lock()
_provider: TracerProvider | None = None  # the installed provider; None: tracing is off


class RequestTimes(Protocol):
    """What ``request_spans`` reads (``lookahead_core.engine.request.ServeStats``): seconds from submission."""

    queue_wait_s: float  # submitted -> admitted
    first_token_s: float  # submitted -> first token verified (0: none)
    wall_s: float  # submitted -> released
    new_tokens: int
    forward_steps: int
    draft_tokens: int
    finish_reason: str


class EdgePropagator(TraceContextTextMapPropagator):
    """W3C ``traceparent`` only: a caller's ``tracestate`` is dropped on extract, and ``baggage`` is not read
    (nor written) at all, so nothing a caller sends besides its trace and parent ids travels on."""

    def extract(self, carrier: CarrierT, context: Context | None = None,
                getter: Getter[CarrierT] = default_getter) -> Context:
        extracted = super().extract(carrier, context, getter)
        parent = trace.get_current_span(extracted).get_span_context()
        if not parent.is_valid or not parent.trace_state:
            return extracted
        bare = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=parent.trace_flags,
                           trace_state=TraceState())
        return trace.set_span_in_context(NonRecordingSpan(bare), context)


def sampler(ratio: float) -> Sampler:
    """The operator's ``sample_ratio`` by trace id for every span, a caller's sampled flag notwithstanding
    (a parent-based sampler would let any caller turn sampling on)."""
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    return TraceIdRatioBased(ratio)


def active() -> bool:
    """A provider is installed (tracing on)."""
    return _provider is not None


def provider() -> TracerProvider | None:
    return _provider


def tracer(name: str) -> Tracer | None:
    """A tracer of the installed provider (None: tracing is off), for code that takes one explicitly."""
    installed = _provider
    return None if installed is None else installed.get_tracer(name)


def install(tracer_provider: TracerProvider, set_global: bool = True) -> None:
    """Make ``tracer_provider`` the one our interceptors, app and spans use; with ``set_global`` also
    OTel's global provider (once per process: a later one is refused by OTel and logged)."""
    global _provider
    with _lock:
        _provider = tracer_provider
    propagate.set_global_textmap(EdgePropagator())  # traceparent only, in and out (our interceptors' too)
    if set_global:
        trace.set_tracer_provider(tracer_provider)


def uninstall() -> TracerProvider | None:
    """Tracing off again for what starts next (tests); returns the provider that was installed."""
    global _provider
    with _lock:
        old, _provider = _provider, None
    return old


def setup(settings: TracingSettings, services: Collection[str]) -> bool:
    """Install a provider exporting to the configured OTLP endpoint, once per process; a no-op when
    tracing is off or a provider is installed already. Returns whether tracing is on."""
    if _provider is not None or not settings.enabled:
        return _provider is not None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = settings.name_for(services)
    tracer_provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}),
                                     sampler=sampler(settings.sample_ratio))
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint)))
    install(tracer_provider)
    log.info("tracing on: %s spans to %s (sample ratio %g)", name, settings.endpoint, settings.sample_ratio)
    return True


def shutdown() -> None:
    """Flush and stop the installed provider (the end of a process); tracing is off afterwards."""
    old = uninstall()
    if old is not None:
        old.shutdown()


# --- instrumentation -------------------------------------------------------------------------------


def _traced_call(details: Any) -> bool:
    """Calls that get spans: not health checks, not reflection."""
    method = getattr(details, "method", "") or ""
    if isinstance(method, bytes):  # a client call's details carry it encoded
        method = method.decode("utf-8", "replace")
    method = str(method).lstrip("/")
    return not method.startswith(UNTRACED_GRPC_PREFIXES)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The OTel gRPC server interceptor (after the auth interceptors: no span for a refused caller); [] when
    tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_provider, filter_=_traced_call)]


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The OTel gRPC client interceptors (a span per call, ``traceparent`` sent); [] when tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider, filter_=_traced_call))


def instrument_app(app: FastAPI) -> None:
    """A server span for each request (not /health, /metrics), opened inside the middleware added so far
    (the request guard: a refused caller starts none); nothing when tracing is off. Call it before the
    app serves (its middleware stack is built on the first request)."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.util.http import parse_excluded_urls
    from starlette.middleware import Middleware

    app.user_middleware.append(Middleware(  # last: the innermost of the user middleware
        OpenTelemetryMiddleware, tracer_provider=_provider, excluded_urls=parse_excluded_urls(UNTRACED_HTTP_PATHS),
        default_span_details=partial(_route_details, app), exclude_spans=["receive", "send"]))  # not a span a chunk


def _route_details(app: FastAPI, scope: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """A server span's name and ``http.route``: the method and the route's path template (as FastAPI's own
    instrumentation names them), or the method alone for a path no route serves."""
    from opentelemetry.instrumentation.asgi import get_default_span_details
    from starlette.routing import Match

    method = get_default_span_details(scope)[0].split(" ", 1)[0]
    for route in app.router.routes:
        if route.matches(scope)[0] is Match.FULL:
            path = getattr(route, "path", "")
            return f"{method} {path}", {"http.route": path}
    return method, {}


# --- the engine's steps ----------------------------------------------------------------------------


def request_spans(st: RequestTimes, model_name: str) -> None:
    """A finished request's queue, prefill and decode as spans of the current trace (the caller's
    HTTP or gRPC span), timed from ``st`` and ending now; nothing when tracing is off."""
    if _provider is None or not trace.get_current_span().get_span_context().is_valid:
        return
    tracer = _provider.get_tracer(TRACER_NAME)
    end = time.time_ns()
    submitted = end - int(st.wall_s * NS_PER_S)
    admitted = submitted + int(st.queue_wait_s * NS_PER_S)
    first = max(admitted, submitted + int(st.first_token_s * NS_PER_S) if st.first_token_s else end)
    steps = ((QUEUE, submitted, admitted), (PREFILL, admitted, first), (DECODE, first, end))
    for name, start, stop in steps:
        span = tracer.start_span(name, start_time=start, attributes={"gen_ai.request.model": model_name})
        if name == DECODE:
            span.set_attributes({
                "gen_ai.usage.output_tokens": st.new_tokens, "gen_ai.response.finish_reasons": [st.finish_reason],
                "lookahead.forward_steps": st.forward_steps, "lookahead.draft_tokens": st.draft_tokens,
            })
        span.end(end_time=stop)
