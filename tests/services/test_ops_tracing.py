"""OpenTelemetry tracing without a model: settings, on/off, one trace across a real gRPC hop, the
engine's step spans. The whole pipeline's trace (HTTP -> generator -> retriever -> draft cache) is
tests/pipeline/test_tracing_pipeline.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.settings import ConfigError, TracingSettings, load_settings
from lookahead_rag.services.common.telemetry import tracing

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120
PROBE = "/tracetest.Probe/Echo"
S = 1_000_000_000  # nanoseconds per second


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, into memory (not OTel's global provider); off again after it."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider, set_global=False)
    yield spans
    tracing.uninstall()


def test_settings_endpoint_from_the_section_or_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                "OTEL_SERVICE_NAME", "LAR_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    # nothing configured: off
    assert not load_settings(TracingSettings, "tracing").enabled
    # OTel's standard variable turns it on; ours wins over it
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert load_settings(TracingSettings, "tracing").endpoint == "http://collector:4317"
    monkeypatch.setenv("LAR_TRACING_OTLP_ENDPOINT", "http://ours:4317")
    assert load_settings(TracingSettings, "tracing").endpoint == "http://ours:4317"
    # OTEL_SDK_DISABLED=true turns it off whatever else says
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not load_settings(TracingSettings, "tracing").enabled
    # service.name: one service's name, or the setting, or OTEL_SERVICE_NAME
    settings = TracingSettings()
    assert settings.name_for(["generator"]) == "lookahead-rag-generator"
    assert settings.name_for(["retriever", "draftcache", "generator"]) == "lookahead-rag"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    assert TracingSettings().name_for(["generator"]) == "from-otel"
    assert TracingSettings(service_name="mine").name_for(["generator"]) == "mine"


def test_settings_refuse_a_ratio_outside_0_1(monkeypatch: pytest.MonkeyPatch) -> None:
    # a bad value is a one-line ConfigError naming the field
    monkeypatch.setenv("LAR_TRACING_SAMPLE_RATIO", "1.5")
    with pytest.raises(ConfigError, match="sample_ratio"):
        load_settings(TracingSettings, "tracing")


def test_off_installs_nothing() -> None:
    assert not tracing.active()
    # no interceptors, an unwrapped app, no spans
    assert tracing.server_interceptors() == [] and tracing.client_interceptors() == []
    app = FastAPI()
    tracing.instrument_app(app)
    assert app.user_middleware == []
    assert not tracing.setup(TracingSettings(otlp_endpoint=""), ["generator"]) and tracing.provider() is None


OFF_SCRIPT = """
import asyncio, sys
from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.common.telemetry import tracing
async def main():
    assert not tracing.setup(AllSettings.load(None).tracing, ["generator"])
    server, port = await start_server([], [], port=0)
    async with open_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
    await stop_server(server, 0)
asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.instrumentation"))))
"""

ON_SCRIPT = """
from opentelemetry import trace
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.common.settings import TracingSettings
assert tracing.setup(TracingSettings(sample_ratio=0.25), ["retriever"])
provider = tracing.provider()
assert trace.get_tracer_provider() is provider, "the global provider: the OTel API's users join our traces"
print(provider.resource.attributes["service.name"], provider.sampler.get_description())
assert tracing.setup(TracingSettings(), ["retriever"]) and tracing.provider() is provider  # once per process
tracing.shutdown()
assert not tracing.active()
"""


def run_python(script: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LAR_TRACING_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={**clean, "HF_HUB_OFFLINE": "1", **env}, timeout=SUBPROCESS_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_off_a_process_never_imports_the_sdk() -> None:
    # a server and a channel started with tracing off: neither the SDK nor an instrumentation is loaded
    assert run_python(OFF_SCRIPT) == "[]"


def test_on_from_otel_env_installs_the_global_provider_once() -> None:
    # OTEL_EXPORTER_OTLP_ENDPOINT alone turns it on: service.name derived, the operator's ratio sampler (not
    # parent-based: a caller's sampled flag does not turn sampling on, tests/hostile/test_trace_edge.py)
    out = run_python(ON_SCRIPT, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317")
    assert out.startswith("lookahead-rag-retriever TraceIdRatioBased") and "0.25" in out, out


@dataclass
class Seen:
    """What the probe servicer saw of the trace it ran in."""

    trace_id: int = 0


def probe_handler(seen: Seen) -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.trace_id = trace.get_current_span().get_span_context().trace_id
        return request

    return grpc.method_handlers_generic_handler("tracetest.Probe", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})


@pytest.mark.asyncio
async def test_one_trace_across_a_grpc_hop(exporter: InMemorySpanExporter) -> None:
    seen = Seen()

    def add(handler: Any, server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((handler,))

    server, port = await start_server([(add, probe_handler(seen))], ["tracetest.Probe"], port=0)
    try:
        tracer = tracing.provider().get_tracer("test")  # type: ignore[union-attr]
        async with open_channel(f"127.0.0.1:{port}") as channel:
            with tracer.start_as_current_span("caller") as caller:
                assert await channel.unary_unary(PROBE)(b"hi") == b"hi"
            health = channel.unary_unary("/grpc.health.v1.Health/Check")
            await health(b"")  # an empty HealthCheckRequest: the overall server
    finally:
        await stop_server(server, 0)
    spans = exporter.get_finished_spans()
    want = caller.get_span_context().trace_id
    # the client's and the server's spans of the call are in the caller's trace, parent to child
    (client,) = [s for s in spans if s.kind is SpanKind.CLIENT]
    (server_span,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert {client.context.trace_id, server_span.context.trace_id} == {want}
    assert client.parent.span_id == caller.get_span_context().span_id  # type: ignore[union-attr]
    assert server_span.parent.span_id == client.context.span_id  # type: ignore[union-attr]
    # the servicer ran inside it: our own spans there join the same trace
    assert seen.trace_id == want
    # health checks make no spans, on either side
    assert not [s.name for s in spans if "Health" in s.name]


def times() -> SimpleNamespace:
    """A finished request's engine stats (the fields request_spans reads): 0.5 s queued, first token at
    1.5 s, done at 4 s, 12 tokens in 5 forwards from 40 draft tokens."""
    return SimpleNamespace(queue_wait_s=0.5, first_token_s=1.5, wall_s=4.0, new_tokens=12, forward_steps=5,
                           draft_tokens=40, finish_reason="length")


def test_request_spans_time_queue_prefill_decode_in_the_current_trace(exporter: InMemorySpanExporter) -> None:
    tracer = tracing.provider().get_tracer("test")  # type: ignore[union-attr]
    with tracer.start_as_current_span("request") as parent:
        tracing.request_spans(times(), "m")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    queue, prefill, decode = spans[tracing.QUEUE], spans[tracing.PREFILL], spans[tracing.DECODE]
    # children of the current span, back to back, as long as the stats say
    for span in (queue, prefill, decode):
        assert span.parent.span_id == parent.get_span_context().span_id  # type: ignore[union-attr]
        assert span.attributes["gen_ai.request.model"] == "m"  # type: ignore[index]
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert abs((queue.end_time - queue.start_time) - 0.5 * S) < S // 1000  # type: ignore[operator]
    assert abs((prefill.end_time - prefill.start_time) - 1.0 * S) < S // 1000  # type: ignore[operator]
    assert abs((decode.end_time - decode.start_time) - 2.5 * S) < S // 1000  # type: ignore[operator]
    assert decode.attributes["gen_ai.usage.output_tokens"] == 12  # type: ignore[index]
    assert decode.attributes["lookahead.draft_tokens"] == 40  # type: ignore[index]


def test_request_spans_need_a_trace(exporter: InMemorySpanExporter) -> None:
    # no current span (a request nobody traced): no orphan spans
    tracing.request_spans(times(), "m")
    assert exporter.get_finished_spans() == ()
