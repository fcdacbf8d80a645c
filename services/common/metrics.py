"""Prometheus metrics, each defined once here; one set per CollectorRegistry.

A service process uses the default registry; tests and ``serve all`` may pass their own so that
in-process instances do not collide::

    registry = CollectorRegistry()                       # or None: prometheus_client.REGISTRY
    interceptors = [ObservabilityInterceptor(registry)]  # grpc.aio.server(interceptors=...)
    port = start_metrics_server(9103, registry)          # GET http://host:port/metrics
    GeneratorMetrics.of(registry).record_answer(new_tokens=128, forward_steps=40, ...)

Names start with ``lookahead_rag_``. Tenant appears as a label only on the draft cache's size
gauges (bounded by its max_tenants setting); nothing else is labelled by request data.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Self

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from services.common.logging import REQUEST_ID_HEADER, request_context

NS = "lookahead_rag"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ACCEPTED_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500)
DRAFT_SOURCES = ("prompt", "tenant_cache", "references")

_GROUPS: weakref.WeakKeyDictionary[CollectorRegistry, dict[type, Any]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


class MetricGroup:
    """A set of metrics registered once per registry; ``Group.of(registry)`` returns that one set."""

    @classmethod
    def of(cls, registry: CollectorRegistry | None = None) -> Self:
        registry = REGISTRY if registry is None else registry
        with _GROUPS_LOCK:
            groups = _GROUPS.setdefault(registry, {})
            if cls not in groups:
                groups[cls] = cls(registry)
            return groups[cls]

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), namespace=NS, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), namespace=NS, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
                  ) -> Histogram:
        return Histogram(name, doc, list(labels), namespace=NS, registry=self.registry, buckets=buckets)


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


class GeneratorMetrics(MetricGroup):
    """Decoding: tokens, forward steps, tokens per step, first-token latency, speed, draft sources."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.new_tokens = self.counter("generator_new_tokens", "tokens generated")
        self.forward_steps = self.counter("generator_forward_steps", "model forwards (one per draft tree)")
        self.accepted_per_step = self.histogram(
            "generator_accepted_tokens_per_step", "tokens one forward step emitted (accepted drafts + 1)",
            ACCEPTED_BUCKETS,
        )
        self.time_to_first_token = self.histogram(
            "generator_time_to_first_token_seconds", "request start to first streamed token", LATENCY_BUCKETS
        )
        self.tokens_per_second = self.histogram(
            "generator_tokens_per_second", "new tokens / decoding wall time, per answer", TOKENS_PER_S_BUCKETS
        )
        self.draft_hits = self.counter(
            "generator_draft_source_hits", "accepted draft tokens by where the draft came from", ("source",)
        )
        self.degraded = self.counter(
            "generator_degraded", "answers given without a dependency (down or past its deadline)",
            ("dependency",),
        )
        for source in DRAFT_SOURCES:  # exported at 0 from the start, so rate() works at once
            self.draft_hits.labels(source)

    def record_steps(self, accepted_per_step: Iterable[int]) -> None:
        """One observation per forward step: the tokens that step emitted."""
        for accepted in accepted_per_step:
            self.accepted_per_step.observe(accepted)

    def record_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def record_answer(self, new_tokens: int, forward_steps: int, decode_s: float,
                      draft_hits: Mapping[str, int] | None = None) -> None:
        """A finished answer: totals, its speed, and accepted draft tokens per source (DRAFT_SOURCES)."""
        hits = dict(draft_hits or {})
        unknown = set(hits) - set(DRAFT_SOURCES)
        if unknown:  # checked first: a bad call records nothing
            raise ValueError(f"unknown draft source {sorted(unknown)} (one of {', '.join(DRAFT_SOURCES)})")
        self.new_tokens.inc(new_tokens)
        self.forward_steps.inc(forward_steps)
        if decode_s > 0 and new_tokens > 0:
            self.tokens_per_second.observe(new_tokens / decode_s)
        for source, count in hits.items():
            self.draft_hits.labels(source).inc(count)

    def record_degraded(self, dependency: str) -> None:
        """An answer went on without ``dependency`` ("retriever" or "draftcache")."""
        self.degraded.labels(dependency).inc()


class DraftCacheMetrics(MetricGroup):
    """Trie size per tenant and Fetch latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.trie_nodes = self.gauge("draftcache_trie_nodes", "trie nodes held per tenant", ("tenant",))
        self.trie_bytes = self.gauge("draftcache_trie_bytes", "approx. trie bytes per tenant", ("tenant",))
        self.fetch_latency = self.histogram(
            "draftcache_fetch_latency_seconds", "time to assemble one Fetch's branches", LATENCY_BUCKETS
        )

    def set_tenant_size(self, tenant: str, nodes: int, nbytes: int) -> None:
        self.trie_nodes.labels(tenant).set(nodes)
        self.trie_bytes.labels(tenant).set(nbytes)

    def forget_tenant(self, tenant: str) -> None:
        for gauge in (self.trie_nodes, self.trie_bytes):
            with contextlib.suppress(KeyError):
                gauge.remove(tenant)

    def record_fetch(self, seconds: float) -> None:
        self.fetch_latency.observe(seconds)


class ConsumerMetrics(MetricGroup):
    """Event consumers, labelled by logical consumer name ("draftcache", "retriever")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.lag = self.gauge(
            "consumer_lag_events", "events in the partition not yet applied (end offset - position)",
            ("consumer", "partition"),
        )
        self.event_age = self.histogram(
            "consumer_event_age_seconds", "event creation to applied", LATENCY_BUCKETS, ("consumer",)
        )
        self.applied = self.counter("consumer_applied_events", "events applied to the state", ("consumer",))
        self.redelivered = self.counter(
            "consumer_redelivered_events", "events seen again and skipped (already applied, by event id)",
            ("consumer",),
        )
        self.dead_lettered = self.counter(
            "consumer_dead_lettered_events", "events sent to the dead-letter topic", ("consumer",)
        )

    def set_lag(self, consumer: str, partition: int, lag: int) -> None:
        self.lag.labels(consumer, str(partition)).set(lag)

    def record_applied(self, consumer: str, count: int = 1, age_s: float | None = None) -> None:
        self.applied.labels(consumer).inc(count)
        if age_s is not None:
            self.event_age.labels(consumer).observe(max(age_s, 0.0))

    def record_redelivered(self, consumer: str, count: int = 1) -> None:
        self.redelivered.labels(consumer).inc(count)

    def record_dead_lettered(self, consumer: str, count: int = 1) -> None:
        self.dead_lettered.labels(consumer).inc(count)


class OutboxMetrics(MetricGroup):
    """The producer's durable outbox."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.depth = self.gauge("outbox_depth", "events stored but not yet acknowledged by Kafka")
        self.sent = self.counter("outbox_sent_events", "events Kafka acknowledged")

    def set_depth(self, depth: int) -> None:
        self.depth.set(depth)

    def record_sent(self, count: int = 1) -> None:
        self.sent.inc(count)


# --- the gRPC server interceptor ------------------------------------------------------------------

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


def _code(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions hand back the integer value
        return next((c for c in grpc.StatusCode if c.value[0] == code), default)
    return default


class _Call:
    """One call's bookkeeping: request context for logs, in-flight gauge, count and latency at the end."""

    def __init__(self, metrics: RpcMetrics, method: str, context: grpc.aio.ServicerContext) -> None:
        self.metrics, self.method, self.context = metrics, method, context
        metadata = dict(context.invocation_metadata() or ())
        self.scope = request_context(metadata.get(REQUEST_ID_HEADER) or None)
        self.start = 0.0

    def __enter__(self) -> None:
        self.scope.__enter__()
        self.metrics.in_flight.labels(self.method).inc()
        self.start = time.perf_counter()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            code = _code(self.context, grpc.StatusCode.OK)
        elif issubclass(exc_type, asyncio.CancelledError | GeneratorExit):
            code = grpc.StatusCode.CANCELLED
        else:  # abort() raises after setting the code; anything else is UNKNOWN to the client
            code = _code(self.context, grpc.StatusCode.UNKNOWN)
        self.metrics.in_flight.labels(self.method).dec()
        self.metrics.record(self.method, code, time.perf_counter() - self.start)
        self.scope.__exit__(exc_type, exc, tb)


def _wrap_unary_response(behavior: Behavior, metrics: RpcMetrics, method: str) -> Behavior:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with _Call(metrics, method, context):
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

    return wrapper


def _wrap_stream_response(behavior: Behavior, metrics: RpcMetrics, method: str) -> Behavior:
    if inspect.isasyncgenfunction(behavior) or not inspect.iscoroutinefunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with _Call(metrics, method, context):
                responses = behavior(request, context)
                if inspect.isawaitable(responses):  # a plain function returning a context.write() coroutine
                    await responses
                elif hasattr(responses, "__aiter__"):
                    async for response in responses:
                        yield response
                else:
                    for response in responses:
                        yield response

        return stream

    async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:  # context.write() style
        with _Call(metrics, method, context):
            await behavior(request, context)

    return writer


def instrument_handler(handler: grpc.RpcMethodHandler, method: str, metrics: RpcMetrics
                       ) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour wrapped to record ``metrics`` and bind the request context."""
    kinds: list[tuple[str, Callable[..., grpc.RpcMethodHandler], Callable[..., Behavior]]] = [
        ("unary_unary", grpc.unary_unary_rpc_method_handler, _wrap_unary_response),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, _wrap_unary_response),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, _wrap_stream_response),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, _wrap_stream_response),
    ]
    for attr, make, wrap in kinds:
        behavior = getattr(handler, attr)
        if behavior is not None:
            return make(
                wrap(behavior, metrics, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


class ObservabilityInterceptor(grpc.aio.ServerInterceptor):
    """For every call of any servicer: count and time it by method and status code, track calls in
    flight, and bind a request id (the ``x-request-id`` metadata, or a new one) for its log lines.

    Calls to unknown methods (UNIMPLEMENTED) are answered by gRPC itself and not counted.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.metrics = RpcMetrics.of(registry)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return instrument_handler(handler, handler_call_details.method, self.metrics)


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
