"""One trace per request across the real pipeline: the HTTP endpoint (or the generator's gRPC
Answer), the engine's queue/prefill/decode, the retriever's Retrieve and the draft cache's Fetch
over real gRPC, and the Kafka consumers that apply the finished answer (the draft cache's and the
retriever's, over the bundled broker), all under one trace id, in an in-memory span exporter
(tracing on for this module only, through ``tracing.install``; not OTel's global provider)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP, RETRIEVER_GROUP
from tests.http.helpers import ask, model, openai_client
from tests.kafka.helpers import fast_settings, new_topic
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, running_pipeline, wait_until

pytestmark = [module_loop, pytest.mark.kafka]

MAX_NEW = 8
SPAN_WAIT_S = 60.0  # the HTTP server span ends just after the reply's last byte
RETRIEVE = "/lookahead_rag.v1.Retriever/Retrieve"
FETCH = "/lookahead_rag.v1.DraftCache/Fetch"
ANSWER = "/lookahead_rag.v1.Generator/Answer"
CHAT_ROUTE = "/v1/chat/completions"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def traced(tmp_path_factory: pytest.TempPathFactory, broker: LocalBroker
                 ) -> AsyncIterator[tuple[RunningPipeline, InMemorySpanExporter]]:
    """A pipeline (three gRPC servers + the HTTP endpoint, events over Kafka) started with tracing on,
    into memory."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider, set_global=False)
    try:
        kafka = fast_settings(broker.bootstrap, new_topic()).model_dump()
        async with running_pipeline(tmp_path_factory.mktemp("traced"), kafka=kafka) as p:
            yield p, spans
    finally:
        tracing.uninstall()


def by_trace(spans: Sequence[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context.trace_id == trace_id]


def assert_one_tree(trace: list[ReadableSpan], root: ReadableSpan) -> None:
    """Every span of the trace descends from ``root`` (one trace, one root, no orphans)."""
    ids = {s.context.span_id for s in trace}
    assert [s.name for s in trace if s.parent is None] == [root.name]
    for span in trace:
        assert span is root or span.parent.span_id in ids, span.name  # type: ignore[union-attr]


def server_span(trace: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in trace if s.kind is SpanKind.SERVER and s.name == name]
    assert len(found) == 1, (name, [s.name for s in trace])
    return found[0]


async def test_an_http_request_is_one_trace_across_the_services(
        traced: tuple[RunningPipeline, InMemorySpanExporter]) -> None:
    p, spans = traced
    tenant = p.new_tenant("http-trace")
    spans.clear()
    async with openai_client(p, tenant) as client:
        got = await client.chat.completions.create(model=model(p), messages=ask(QUESTION), max_tokens=MAX_NEW)
    assert got.choices[0].message.content

    def http_span() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans()
                if s.kind is SpanKind.SERVER and (s.attributes or {}).get("http.route") == CHAT_ROUTE]

    assert await wait_until(lambda: bool(http_span()), SPAN_WAIT_S)
    (root,) = http_span()

    def consumed() -> list[ReadableSpan]:
        return [s for s in by_trace(spans.get_finished_spans(), root.context.trace_id) if s.kind is SpanKind.CONSUMER]

    def groups() -> set[object]:
        return {(s.attributes or {}).get("messaging.consumer.group.name") for s in consumed()}

    # the finished answer crossed Kafka: the draft cache's and the retriever's consumers applied it inside the
    # request's trace (the generator's forget consumer reads the same stream, so a third group may show too).
    # Delivery is at least once (a record read again after a rebalance, or resent by the producer, is one
    # more span of the same trace; the appliers drop repeats by event id), so a group counts once
    kafka = p.pipeline.settings.kafka
    appliers = {kafka.group_id(DRAFTCACHE_GROUP), kafka.replica_group_id(RETRIEVER_GROUP)}
    assert await wait_until(lambda: appliers <= groups(), SPAN_WAIT_S), (appliers, [
        (s.name, (s.attributes or {}).get("messaging.consumer.group.name")) for s in consumed()])
    assert None not in groups(), [s.attributes for s in consumed()]  # every consumer span names its group
    trace = by_trace(spans.get_finished_spans(), root.context.trace_id)
    names = {s.name for s in trace}
    # the HTTP call, the generator's engine steps, the retriever and the draft cache: one trace
    assert {tracing.QUEUE, tracing.PREFILL, tracing.DECODE} <= names, names
    retrieve, fetch = server_span(trace, RETRIEVE), server_span(trace, FETCH)
    # each service's server span is the child of the generator's client span for that call
    for served in (retrieve, fetch):
        (client,) = [s for s in trace if s.kind is SpanKind.CLIENT and s.name == served.name]
        assert served.parent.span_id == client.context.span_id  # type: ignore[union-attr]
    assert_one_tree(trace, root)
    # the engine's spans hang off the HTTP request, and say what was decoded
    (decode,) = [s for s in trace if s.name == tracing.DECODE]
    assert decode.attributes["gen_ai.usage.output_tokens"] == got.usage.completion_tokens  # type: ignore[index,union-attr]
    assert decode.attributes["gen_ai.request.model"] == model(p)  # type: ignore[index]


async def test_a_grpc_answer_is_one_trace_rooted_at_the_generator(
        traced: tuple[RunningPipeline, InMemorySpanExporter]) -> None:
    p, spans = traced
    tenant = p.new_tenant("grpc-trace")
    spans.clear()
    got = await p.answer(tenant, max_new_tokens=MAX_NEW)
    assert got.final is not None

    def answer_span() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER and s.name == ANSWER]

    assert await wait_until(lambda: bool(answer_span()), SPAN_WAIT_S)
    (root,) = answer_span()
    trace = by_trace(spans.get_finished_spans(), root.context.trace_id)
    # the caller sent no traceparent: the generator's Answer is the root; the rest descends from it
    server_span(trace, RETRIEVE)
    server_span(trace, FETCH)
    assert tracing.DECODE in {s.name for s in trace}
    assert_one_tree(trace, root)
    # nothing of this request went to another trace
    assert {s.context.trace_id for s in spans.get_finished_spans() if s.name in (RETRIEVE, FETCH)} == {
        root.context.trace_id}
