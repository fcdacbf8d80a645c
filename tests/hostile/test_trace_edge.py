"""Issue 32 item 8: tracing trusts no caller. A call refused by the auth checks starts no span (gRPC and
HTTP); sampling is the operator's ``sample_ratio``, whatever sampled flag a caller sends; and a caller's
``baggage`` and ``tracestate`` are dropped where they come in, so the headers the outbox, Kafka records
and dead letters carry (``events.trace_context.context_headers``) hold its ``traceparent`` only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lookahead_rag.services.common.auth.interceptor import server_interceptors
from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.v1 import retriever_pb2, retriever_pb2_grpc
from tests.hostile.test_http_first import TENANT, app_of, body, keyed_auth

REPO = Path(__file__).resolve().parents[2]
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SAMPLED_PARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"  # a caller asking for its trace to be sampled
HOSTILE_HEADERS = {"traceparent": SAMPLED_PARENT, "tracestate": "evil=1", "baggage": "user=victim,role=admin"}
SUBPROCESS_TIMEOUT_S = 120


class Refused(retriever_pb2_grpc.RetrieverServicer):
    """Never reached: the calls here have no credential."""


@pytest.mark.asyncio
async def test_a_grpc_call_refused_by_auth_starts_no_span(exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    auth, _ = keyed_auth(tmp_path)
    servicer = (retriever_pb2_grpc.add_RetrieverServicer_to_server, Refused())
    server, port = await start_server([servicer], ["lookahead_rag.v1.Retriever"], port=0,
                                      interceptors=server_interceptors(None, auth))
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Stats(retriever_pb2.RetrieverStatsRequest(tenant=TENANT),
                                 metadata=tuple(HOSTILE_HEADERS.items()))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await stop_server(server, 0)
    assert [s.name for s in exporter.get_finished_spans() if s.kind.name == "SERVER"] == []


@pytest.mark.asyncio
async def test_an_http_request_refused_by_the_guard_starts_no_span(exporter: InMemorySpanExporter,
                                                                   tmp_path: Path) -> None:
    app, engine, _ = app_of(tmp_path)
    tracing.instrument_app(app)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/chat/completions", json=body(), headers=HOSTILE_HEADERS)
    assert response.status_code == 401 and engine.calls == 0
    assert exporter.get_finished_spans() == ()


EDGE_SCRIPT = f"""
from opentelemetry import propagate, trace
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.common.settings import TracingSettings
from lookahead_rag.services.events.trace_context import context_headers
assert tracing.setup(TracingSettings(otlp_endpoint="http://127.0.0.1:9", sample_ratio=0.0), ["generator"])
caller = propagate.extract({HOSTILE_HEADERS!r})
tracer = tracing.tracer("probe")
with tracer.start_as_current_span("edge", context=caller) as span:
    sampled = span.is_recording()
    trace_id = format(span.get_span_context().trace_id, "032x")
    headers = sorted(name for name, _ in context_headers())
print(sampled, trace_id, headers)
"""


def run_python(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=SUBPROCESS_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_operators_ratio_samples_and_only_traceparent_travels_on() -> None:
    sampled, trace_id, headers = run_python(EDGE_SCRIPT).split(" ", 2)
    assert sampled == "False", "a caller's sampled flag turned sampling on over sample_ratio = 0"
    assert trace_id == TRACE_ID  # the caller's trace is still joined
    assert headers == "['traceparent']", headers


def test_a_callers_tracestate_and_baggage_are_dropped_on_extract(exporter: Any) -> None:
    from opentelemetry import baggage, propagate, trace

    context = propagate.extract(HOSTILE_HEADERS)
    parent = trace.get_current_span(context).get_span_context()
    assert format(parent.trace_id, "032x") == TRACE_ID and not parent.trace_state
    assert baggage.get_all(context) == {}
