"""Per-tenant quotas over real gRPC and HTTP: a tenant over its rate or at its stream limit gets
RESOURCE_EXHAUSTED with a one-line message and a ``google.rpc.RetryInfo`` in the status details (HTTP:
429 and ``Retry-After``); a stream's slot is freed when it ends, fails or is cancelled. The quotas are
per-tenant overrides in ``[limits] tenant_quotas`` (the default is unlimited, as for every other
module's tenants); a rate of one request per RATE_PERIOD_S makes the second request a refusal
without any timing, and ``ForwardGate`` holds a stream open deterministically.
"""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from lookahead_rag.v1 import generator_pb2, retriever_pb2, retriever_pb2_grpc
from tests.http.helpers import TENANT_HEADER, ask, model, raw_client
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    RunningPipeline,
    assert_status,
    collect,
    module_loop,
    module_pipeline,
    params,
    rpc_error,
    unique_tenant,
    wait_until,
)
from tests.pipeline.spies import ForwardGate

pytestmark = module_loop

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
RATE_PERIOD_S = 1000.0  # one request per this many seconds: the second one within a test is always refused
STREAM_RETRY_S = 2.0  # [limits] tenant_streams_retry_s
ONE_PER_PERIOD = {"rps": 1 / RATE_PERIOD_S, "burst": 1}
ONE_STREAM = {"streams": 1}
RATE, STREAMS, CANCELLED, FAILED, HTTP_RATE, INGEST_RATE = (
    unique_tenant(f"quota-{name}") for name in ("rate", "streams", "cancelled", "failed", "http", "ingest"))

pipe = module_pipeline(limits={
    "tenant_streams_retry_s": STREAM_RETRY_S,
    "tenant_quotas": {RATE: ONE_PER_PERIOD, HTTP_RATE: ONE_PER_PERIOD, INGEST_RATE: ONE_PER_PERIOD,
                      STREAMS: ONE_STREAM, CANCELLED: ONE_STREAM, FAILED: ONE_STREAM},
})


async def retry_delay_s(call: grpc.aio.Call) -> float:
    """The RetryInfo delay in the ended call's status details (the one-line message must match them)."""
    status = await rpc_status.aio.from_call(call)
    assert status is not None, "no google.rpc.Status in the trailers"
    assert status.code == EXHAUSTED.value[0]
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1, status.details
    info = error_details_pb2.RetryInfo()
    infos[0].Unpack(info)
    return info.retry_delay.ToNanoseconds() / 1e9


def answer_call(p: RunningPipeline, tenant: str, question: str = "What does json.dumps do?",
                timeout: float = CALL_TIMEOUT_S) -> grpc.aio.UnaryStreamCall:
    return p.stub.Answer(p.answer_request(tenant, question, max_new_tokens=2), timeout=timeout)


async def held_stream(p: RunningPipeline, tenant: str, gate: ForwardGate) -> grpc.aio.UnaryStreamCall:
    """An Answer of ``tenant`` (its documents ingested) streaming, held: its first delta read, its next
    forward waiting at ``gate``."""
    p.ingest(tenant)
    call = answer_call(p, tenant)
    assert (await call.read()).HasField("delta")
    assert await gate.wait_reached()
    return call


async def test_over_the_rate_is_resource_exhausted_with_retry_info(pipe: RunningPipeline) -> None:
    pipe.ingest(RATE)
    first = await collect(answer_call(pipe, RATE))
    assert first.final is not None
    call = answer_call(pipe, RATE)
    assert_status(await rpc_error(lambda: collect(call)), EXHAUSTED, RATE, "requests/s")
    assert RATE_PERIOD_S - 60 < await retry_delay_s(call) <= RATE_PERIOD_S
    # Generate counts against the same rate
    request = generator_pb2.GenerateRequest(tenant=RATE, prompt="Hi", params=params(max_new_tokens=1))
    generate = pipe.stub.Generate(request, timeout=CALL_TIMEOUT_S)
    assert_status(await rpc_error(lambda: collect(generate)), EXHAUSTED, "requests/s")
    assert pipe.inflight == 0
    other = await pipe.answer(pipe.new_tenant("quota-other"), max_new_tokens=2)  # other tenants are unaffected
    assert other.final is not None


async def test_stream_limit_refuses_until_the_open_stream_ends(pipe: RunningPipeline) -> None:
    quotas = pipe.generator.quotas
    with ForwardGate(pipe.generator.scheduler.backend.kernels, block_at=2) as gate:
        held = await held_stream(pipe, STREAMS, gate)
        assert quotas.open_streams(STREAMS) == 1
        second = answer_call(pipe, STREAMS)
        assert_status(await rpc_error(lambda: collect(second)), EXHAUSTED, STREAMS, "streams open")
        assert await retry_delay_s(second) == pytest.approx(STREAM_RETRY_S)
        gate.release()
        rest = await collect(held)
    assert rest.final is not None
    assert quotas.open_streams(STREAMS) == 0  # freed as the stream ended
    after = await collect(answer_call(pipe, STREAMS))
    assert after.final is not None


async def test_stream_slot_is_freed_when_the_client_cancels(pipe: RunningPipeline) -> None:
    quotas = pipe.generator.quotas
    with ForwardGate(pipe.generator.scheduler.backend.kernels, block_at=2) as gate:
        call = await held_stream(pipe, CANCELLED, gate)
        call.cancel()
        assert await wait_until(lambda: quotas.open_streams(CANCELLED) == 0)
    assert await pipe.wait_idle() == 0
    after = await collect(answer_call(pipe, CANCELLED))
    assert after.final is not None


async def test_stream_slot_is_freed_when_the_request_fails(pipe: RunningPipeline) -> None:
    # admitted, then refused inside: a tenant never ingested is NOT_FOUND; its slot must not leak
    err = await rpc_error(lambda: collect(answer_call(pipe, FAILED)))
    assert_status(err, grpc.StatusCode.NOT_FOUND, "unknown tenant")
    assert pipe.generator.quotas.open_streams(FAILED) == 0
    pipe.ingest(FAILED)
    after = await collect(answer_call(pipe, FAILED))  # the one slot is free
    assert after.final is not None


async def test_http_over_the_rate_is_429_with_retry_after(pipe: RunningPipeline) -> None:
    pipe.ingest(HTTP_RATE)
    body = {"model": model(pipe), "messages": ask("What does json.dumps do?"), "max_tokens": 2}
    headers = {TENANT_HEADER: HTTP_RATE}
    async with raw_client(pipe) as http:
        ok = await http.post("/v1/chat/completions", json=body, headers=headers)
        assert ok.status_code == 200, ok.text
        refused = await http.post("/v1/chat/completions", json=body, headers=headers)
        streamed = await http.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
    for response in (refused, streamed):  # a stream is refused before its status line, the same way
        assert response.status_code == 429, response.text
        assert RATE_PERIOD_S - 60 < int(response.headers["retry-after"]) <= RATE_PERIOD_S
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "resource_exhausted"
        assert HTTP_RATE in error["message"]
    assert pipe.inflight == 0


async def test_ingest_over_the_rate_is_resource_exhausted_with_retry_info(pipe: RunningPipeline) -> None:
    doc = retriever_pb2.Document(id="d1", title="t", text="Some text about quotas.")
    request = retriever_pb2.IngestRequest(tenant=INGEST_RATE, documents=[doc])
    async with grpc.aio.insecure_channel(pipe.target("retriever")) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        first = await stub.Ingest(request, timeout=CALL_TIMEOUT_S)
        assert first.documents == 1
        chunks = pipe.pipeline.retriever.stats(INGEST_RATE).chunks
        other = retriever_pb2.Document(id="d2", title="u", text="Another document, never ingested.")
        call = stub.Ingest(retriever_pb2.IngestRequest(tenant=INGEST_RATE, documents=[other]), timeout=CALL_TIMEOUT_S)
        assert_status(await rpc_error(lambda: call), EXHAUSTED, INGEST_RATE, "requests/s")
        assert RATE_PERIOD_S - 60 < await retry_delay_s(call) <= RATE_PERIOD_S
    assert pipe.pipeline.retriever.stats(INGEST_RATE).chunks == chunks  # the refused call changed nothing
