"""Prometheus metrics, each defined once here; one set per CollectorRegistry.

A service process uses the default registry; tests and ``serve all`` may pass their own so that
in-process instances do not collide::

    registry = CollectorRegistry()                       # or None: prometheus_client.REGISTRY
    interceptors = [ObservabilityInterceptor(registry)]  # grpc.aio.server(interceptors=...)
    port = start_metrics_server(9103, registry)          # GET http://host:port/metrics
    GeneratorMetrics.of(registry).record_answer(new_tokens=128, forward_steps=40, ...)

Gauges and counters sampled from state (a bus's consumer counters, the outbox depth, trie sizes)
are kept current by a ``Refresher`` that runs its jobs every few seconds off the event loop; an
event applier wrapped in ``ObservedApplier`` records each event's age when it is applied.

Names start with ``lookahead_rag_``. Tenant appears as a label only on the draft cache's size
gauges (bounded by its max_tenants setting); nothing else is labelled by request data.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, Self

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from services.common.logging import REQUEST_ID_HEADER, bind_tenant, request_context

log = logging.getLogger(__name__)

NS = "lookahead_rag"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ACCEPTED_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500)
FORWARD_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # tokens in one batched forward
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32)  # draft tokens granted to one request for one step
DRAFT_SOURCES = ("prompt", "tenant_cache", "references")
QUIET_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # probes: access log at DEBUG

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
        self.queue_depth = self.gauge("generator_queue_depth", "requests waiting in the engine's queue")
        self.running = self.gauge("generator_running_requests", "requests prefilling or decoding")
        self.kv_bytes = self.gauge("generator_kv_bytes", "KV-cache bytes held by running requests")
        self.tokens_per_forward = self.histogram(
            "generator_tokens_per_forward", "tokens in one batched forward (all requests)", FORWARD_TOKEN_BUCKETS
        )
        self.prefix_hit_tokens = self.counter(
            "generator_prefix_cache_hit_tokens", "prompt tokens whose KV came from the prefix cache"
        )
        self.draft_budget = self.histogram(
            "generator_draft_budget_tokens", "draft tokens granted to a request for one step", BUDGET_BUCKETS
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

    def record_forward(self, tokens: int, batch: int) -> None:
        """One batched forward of ``tokens`` tokens for ``batch`` requests (scheduler thread)."""
        self.tokens_per_forward.observe(tokens)

    def record_serving(self, budgets: Iterable[int], prefix_hit_tokens: int) -> None:
        """A finished request: the draft budget of each of its steps, its prefix-cache hit."""
        for budget in budgets:
            self.draft_budget.observe(budget)
        self.prefix_hit_tokens.inc(prefix_hit_tokens)

    def observe_engine(self, waiting: int, running: int, kv_bytes: int) -> None:
        """Sampled engine state (a Refresher job)."""
        self.queue_depth.set(waiting)
        self.running.set(running)
        self.kv_bytes.set(kv_bytes)

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


class CounterSource(Protocol):
    """What a bus's ``counters(group)`` returns (services.common.bus.ConsumerCounters): running totals."""

    applied: int
    duplicates: int
    dead_lettered: int
    apply_errors: int
    redelivered: int
    lag: int


class ConsumerMetrics(MetricGroup):
    """Event consumers, labelled by logical consumer name ("draftcache", "retriever")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.lag = self.gauge(
            "consumer_lag_events", "events published but not yet applied (Kafka: summed over partitions)",
            ("consumer",),
        )
        self.event_age = self.histogram(
            "consumer_event_age_seconds", "event creation to applied", LATENCY_BUCKETS, ("consumer",)
        )
        self.applied = self.counter("consumer_applied_events", "events applied to the state", ("consumer",))
        self.redelivered = self.counter(
            "consumer_redelivered_events", "events seen again and skipped (already applied, by event id)",
            ("consumer",),
        )
        self.replayed = self.counter(
            "consumer_replayed_records", "records read again after a log reset or a restart's replay",
            ("consumer",),
        )
        self.apply_errors = self.counter(
            "consumer_apply_errors", "failed apply attempts (retried, or dead-lettered at the last)", ("consumer",)
        )
        self.dead_lettered = self.counter(
            "consumer_dead_lettered_events", "events sent to the dead-letter topic", ("consumer",)
        )
        self._seen: dict[str, tuple[int, ...]] = {}  # consumer -> totals at the last observe_counters
        self._lock = threading.Lock()

    def set_lag(self, consumer: str, lag: int) -> None:
        self.lag.labels(consumer).set(lag)

    def record_applied(self, consumer: str, count: int = 1, age_s: float | None = None) -> None:
        self.applied.labels(consumer).inc(count)
        if age_s is not None:
            self.record_age(consumer, age_s)

    def record_age(self, consumer: str, age_s: float) -> None:
        self.event_age.labels(consumer).observe(max(age_s, 0.0))

    def record_redelivered(self, consumer: str, count: int = 1) -> None:
        self.redelivered.labels(consumer).inc(count)

    def record_dead_lettered(self, consumer: str, count: int = 1) -> None:
        self.dead_lettered.labels(consumer).inc(count)

    def observe_counters(self, consumer: str, counters: CounterSource) -> None:
        """Bring the counters up to a bus's running totals (adds what moved since the last call; a
        total that went down means the bus restarted its count, so all of it is new) and set the lag."""
        totals = (counters.applied, counters.duplicates, counters.redelivered, counters.apply_errors,
                  counters.dead_lettered)
        with self._lock:
            before = self._seen.get(consumer, (0,) * len(totals))
            self._seen[consumer] = totals
        metrics = (self.applied, self.redelivered, self.replayed, self.apply_errors, self.dead_lettered)
        for metric, now, then in zip(metrics, totals, before, strict=True):
            moved = now - then if now >= then else now
            if moved:
                metric.labels(consumer).inc(moved)
            else:
                metric.labels(consumer)  # exported at 0 from the first sample
        self.set_lag(consumer, counters.lag)


class OutboxMetrics(MetricGroup):
    """The producer's durable outbox."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.depth = self.gauge("outbox_depth", "events stored but not yet acknowledged by Kafka")
        self.sent = self.counter("outbox_sent_events", "events Kafka acknowledged")
        self._seen_sent = 0

    def set_depth(self, depth: int) -> None:
        self.depth.set(depth)

    def record_sent(self, count: int = 1) -> None:
        self.sent.inc(count)

    def observe_sent_total(self, total: int) -> None:
        """Bring ``sent`` up to a flusher's running total (see ConsumerMetrics.observe_counters)."""
        moved = total - self._seen_sent if total >= self._seen_sent else total
        self._seen_sent = total
        if moved:
            self.sent.inc(moved)


# --- state sampled periodically, event age at apply ----------------------------------------------


class Refresher:
    """Runs ``jobs`` (cheap samplers: counters, depths, dirty sizes) every ``interval_s`` in a worker
    thread, so a slow one never blocks the event loop; a failing job is logged and retried next time.

        refresher = Refresher(5.0, [lambda: consumer.observe_counters("draftcache", bus.counters("draftcache"))])
        await refresher.start() ... await refresher.stop()     # refresher.refresh_now() in tests
    """

    def __init__(self, interval_s: float, jobs: Iterable[Callable[[], object]] = ()) -> None:
        self.interval_s = interval_s
        self.jobs: list[Callable[[], object]] = list(jobs)
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one round at a time (the task and refresh_now)

    def add(self, job: Callable[[], object]) -> None:
        self.jobs.append(job)

    def refresh_now(self) -> None:
        with self._lock:
            for job in self.jobs:
                try:
                    job()
                except Exception:  # a metric must never take a service down
                    log.exception("metrics refresh job %r failed", job)

    async def start(self) -> None:
        if self._task is None and self.jobs:
            self._task = asyncio.create_task(self._run(), name="metrics-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.to_thread(self.refresh_now)
            await asyncio.sleep(self.interval_s)


def consumer_jobs(bus: Any, groups: Iterable[str], metrics: ConsumerMetrics) -> list[Callable[[], None]]:
    """Refresher jobs bringing ConsumerMetrics up to ``bus.counters(group)`` of each group."""
    return [lambda g=group: metrics.observe_counters(g, bus.counters(g)) for group in groups]


def outbox_job(bus: Any, metrics: OutboxMetrics) -> Callable[[], None]:
    """A Refresher job sampling a Kafka bus's outbox: its depth and the events Kafka acknowledged."""

    def sample() -> None:
        metrics.set_depth(bus.outbox_depth())
        flusher = getattr(getattr(bus, "publisher", None), "flusher", None)
        if flusher is not None:
            metrics.observe_sent_total(flusher.counters.sent)

    return sample


class ObservedApplier:
    """An EventApplier (services.common.bus) seen by metrics: each applied event's age goes to
    ConsumerMetrics, ``on_applied(event)`` and ``on_restore()`` let state-size gauges know what changed.
    Counts come from the bus's own counters (Refresher + ConsumerMetrics.observe_counters)."""

    def __init__(self, applier: Any, consumer: str, metrics: ConsumerMetrics,
                 on_applied: Callable[[Any], None] | None = None,
                 on_restore: Callable[[], None] | None = None) -> None:
        self.applier = applier
        self.consumer = consumer
        self.metrics = metrics
        self._on_applied = on_applied
        self._on_restore = on_restore

    def apply(self, event: Any) -> bool:
        applied = bool(self.applier.apply(event))
        if applied:
            if event.created_unix_ms:
                self.metrics.record_age(self.consumer, time.time() - event.created_unix_ms / 1000.0)
            if self._on_applied is not None:
                self._on_applied(event)
        return applied

    def snapshot(self) -> bytes:
        return bytes(self.applier.snapshot())

    def restore(self, data: bytes) -> None:
        self.applier.restore(data)
        if self._on_restore is not None:
            self._on_restore()


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
    """One call's bookkeeping: request context (id, and the tenant when the request has one) for logs,
    in-flight gauge, count and latency and one access log line at the end."""

    def __init__(self, metrics: RpcMetrics, method: str, context: grpc.aio.ServicerContext,
                 request: Any = None) -> None:
        self.metrics, self.method, self.context = metrics, method, context
        metadata = dict(context.invocation_metadata() or ())
        self.scope = request_context(metadata.get(REQUEST_ID_HEADER) or None)
        tenant = getattr(request, "tenant", None)
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


def _wrap_unary_response(behavior: Behavior, metrics: RpcMetrics, method: str) -> Behavior:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with _Call(metrics, method, context, request):
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

    return wrapper


def _wrap_stream_response(behavior: Behavior, metrics: RpcMetrics, method: str) -> Behavior:
    if inspect.isasyncgenfunction(behavior) or not inspect.iscoroutinefunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with _Call(metrics, method, context, request):
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
        with _Call(metrics, method, context, request):
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
