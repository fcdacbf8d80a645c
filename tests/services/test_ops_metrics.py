"""Prometheus metrics: the interceptor counts real gRPC calls, /metrics serves them, groups per registry."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from lookahead_rag.services.common.telemetry.observability import (
    ObservabilityInterceptor,
    RpcMetrics,
    start_metrics_server,
    stop_metrics_server,
)
from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
from lookahead_rag.services.events.metrics import ConsumerMetrics, OutboxMetrics
from lookahead_rag.services.generator.metrics import DRAFT_SOURCES, GeneratorMetrics

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
SVC = "/opstest.Probe/"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _fail(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise RuntimeError("boom")


async def _abort(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad")
    return b""


async def _stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        yield bytes([i])


async def _sum(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    total = 0
    async for request in requests:
        total += len(request)
    return bytes([total])


PROBE = grpc.method_handlers_generic_handler("opstest.Probe", {
    "Echo": grpc.unary_unary_rpc_method_handler(_echo),
    "Fail": grpc.unary_unary_rpc_method_handler(_fail),
    "Abort": grpc.unary_unary_rpc_method_handler(_abort),
    "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    "Sum": grpc.stream_unary_rpc_method_handler(_sum),
})


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def exercise(registry: CollectorRegistry) -> None:
    """Health Check x3 (OK), Check of an unknown service (NOT_FOUND), a cancelled Watch, and one call
    of each probe method, against a server with the interceptor."""
    server = grpc.aio.server(interceptors=[ObservabilityInterceptor(registry)])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_generic_rpc_handlers((PROBE,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(3):
                await stub.Check(health_pb2.HealthCheckRequest(service=""))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
            assert await channel.unary_unary(SVC + "Echo")(b"hi") == b"hi"
            for method, code in (("Fail", grpc.StatusCode.UNKNOWN), ("Abort", grpc.StatusCode.INVALID_ARGUMENT)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.unary_unary(SVC + method)(b"x")
                assert info.value.code() == code
            assert [r async for r in channel.unary_stream(SVC + "Stream")(b"")] == [b"\0", b"\1", b"\2"]
            assert await channel.stream_unary(SVC + "Sum")(iter([b"ab", b"c"])) == b"\3"
            for _ in range(100):  # the cancelled Watch finishes on the server asynchronously
                if value(registry, "lookahead_rag_rpc_requests_total", method=WATCH, code="CANCELLED"):
                    break
                await asyncio.sleep(0.02)
    finally:
        await server.stop(None)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_interceptor_counts_calls_and_exporter_serves_them() -> None:
    registry = CollectorRegistry()
    port = start_metrics_server(0, registry)
    try:
        before = scrape(port)
        assert ("lookahead_rag_rpc_requests_total", (("code", "OK"), ("method", CHECK))) not in before
        asyncio.run(exercise(registry))
        after = scrape(port)
    finally:
        stop_metrics_server(port)

    def count(method: str, code: str) -> float:
        return after.get(("lookahead_rag_rpc_requests_total", (("code", code), ("method", method))), 0.0)

    def observed(method: str, code: str) -> float:
        return after.get(("lookahead_rag_rpc_latency_seconds_count", (("code", code), ("method", method))), 0.0)

    assert count(CHECK, "OK") == 3 and observed(CHECK, "OK") == 3
    assert count(CHECK, "NOT_FOUND") == 1 and observed(CHECK, "NOT_FOUND") == 1
    assert count(WATCH, "CANCELLED") == 1  # a write()-style server stream, cancelled by the client
    assert count(SVC + "Echo", "OK") == 1
    assert count(SVC + "Fail", "UNKNOWN") == 1
    assert count(SVC + "Abort", "INVALID_ARGUMENT") == 1
    assert count(SVC + "Stream", "OK") == 1  # an async-generator server stream
    assert count(SVC + "Sum", "OK") == 1  # a client stream
    assert after[("lookahead_rag_rpc_in_flight", (("method", CHECK),))] == 0


def test_exporter_stops_and_port_zero_picks_a_free_port() -> None:
    registry = CollectorRegistry()
    first, second = start_metrics_server(0, registry), start_metrics_server(0, registry)
    assert first != second and first > 0
    stop_metrics_server(first)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{first}/metrics", timeout=2)
    assert scrape(second) is not None
    stop_metrics_server(second)


def test_groups_are_defined_once_per_registry() -> None:
    one, two = CollectorRegistry(), CollectorRegistry()
    assert GeneratorMetrics.of(one) is GeneratorMetrics.of(one)
    assert GeneratorMetrics.of(one) is not GeneratorMetrics.of(two)
    assert RpcMetrics.of(one) is ObservabilityInterceptor(one).metrics
    GeneratorMetrics.of(one).record_answer(new_tokens=10, forward_steps=4, decode_s=0.5)
    assert value(one, "lookahead_rag_generator_new_tokens_total") == 10
    assert value(two, "lookahead_rag_generator_new_tokens_total") == 0


def test_recording_helpers_move_every_issue_metric() -> None:
    registry = CollectorRegistry()
    generator = GeneratorMetrics.of(registry)
    for source in DRAFT_SOURCES:  # present at 0 before any answer
        assert registry.get_sample_value("lookahead_rag_generator_draft_source_hits_total", {"source": source}) == 0
    generator.record_steps([1, 3, 5])
    generator.record_first_token(0.2)
    generator.record_answer(new_tokens=9, forward_steps=3, decode_s=1.5,
                            draft_hits={"prompt": 2, "tenant_cache": 4, "references": 0})
    generator.record_degraded("draftcache")
    generator.record_forward(tokens=40, batch=3)
    generator.record_serving([8, 4, 0], prefix_hit_tokens=200)
    generator.observe_engine(waiting=5, running=16, kv_bytes=1_000_000)
    with pytest.raises(ValueError, match="unknown draft source"):
        generator.record_answer(1, 1, 1.0, {"elsewhere": 1})
    cache = DraftCacheMetrics.of(registry)
    cache.set_tenant_size("acme", nodes=120, nbytes=24_000)
    cache.set_tenant_size("beta", nodes=7, nbytes=900)
    cache.forget_tenant("beta")
    cache.record_fetch(0.004)
    consumer = ConsumerMetrics.of(registry)
    consumer.set_lag("draftcache", 12)
    consumer.record_applied("draftcache", 3, age_s=0.05)
    consumer.record_redelivered("draftcache")
    consumer.record_dead_lettered("retriever")
    outbox = OutboxMetrics.of(registry)
    outbox.set_depth(5)
    outbox.record_sent(2)

    expected: list[tuple[str, dict[str, Any], float]] = [
        ("lookahead_rag_generator_new_tokens_total", {}, 9),
        ("lookahead_rag_generator_forward_steps_total", {}, 3),
        ("lookahead_rag_generator_accepted_tokens_per_step_count", {}, 3),
        ("lookahead_rag_generator_accepted_tokens_per_step_sum", {}, 9),
        ("lookahead_rag_generator_time_to_first_token_seconds_count", {}, 1),
        ("lookahead_rag_generator_tokens_per_second_sum", {}, 6),
        ("lookahead_rag_generator_draft_source_hits_total", {"source": "tenant_cache"}, 4),
        ("lookahead_rag_generator_draft_source_hits_total", {"source": "prompt"}, 2),
        ("lookahead_rag_generator_degraded_total", {"dependency": "draftcache"}, 1),
        ("lookahead_rag_generator_tokens_per_forward_count", {}, 1),
        ("lookahead_rag_generator_tokens_per_forward_sum", {}, 40),
        ("lookahead_rag_generator_draft_budget_tokens_count", {}, 3),
        ("lookahead_rag_generator_draft_budget_tokens_sum", {}, 12),
        ("lookahead_rag_generator_prefix_cache_hit_tokens_total", {}, 200),
        ("lookahead_rag_generator_queue_depth", {}, 5),
        ("lookahead_rag_generator_running_requests", {}, 16),
        ("lookahead_rag_generator_kv_bytes", {}, 1_000_000),
        ("lookahead_rag_draftcache_trie_nodes", {"tenant": "acme"}, 120),
        ("lookahead_rag_draftcache_trie_bytes", {"tenant": "acme"}, 24_000),
        ("lookahead_rag_draftcache_fetch_latency_seconds_count", {}, 1),
        ("lookahead_rag_consumer_lag_events", {"consumer": "draftcache"}, 12),
        ("lookahead_rag_consumer_applied_events_total", {"consumer": "draftcache"}, 3),
        ("lookahead_rag_consumer_event_age_seconds_count", {"consumer": "draftcache"}, 1),
        ("lookahead_rag_consumer_redelivered_events_total", {"consumer": "draftcache"}, 1),
        ("lookahead_rag_consumer_dead_lettered_events_total", {"consumer": "retriever"}, 1),
        ("lookahead_rag_outbox_depth", {}, 5),
        ("lookahead_rag_outbox_sent_events_total", {}, 2),
    ]
    for name, labels, want in expected:
        assert registry.get_sample_value(name, labels) == pytest.approx(want), (name, labels)
    assert registry.get_sample_value("lookahead_rag_draftcache_trie_nodes", {"tenant": "beta"}) is None
