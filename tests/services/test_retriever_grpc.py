"""The Retriever over real gRPC on loopback (port 0): health, reflection, calls, exact status codes.

Also the shared plumbing: services.common.errors (status mapping, unary and streaming) and
services.common.rpc.grpcutil (graceful stop).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lookahead_rag.services.common.errors import InvalidArgument, ResourceExhausted, grpc_errors
from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.retriever.build import retriever_service
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.servicer import SERVICE_NAME
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from tests.services.retriever_helpers import settings, shared_embedder, shared_tokenizer

TENANT = "acme"
DOCS = [
    retriever_pb2.Document(
        id="json.dumps", title="json.dumps(obj, ...)", text="Serialize obj to a JSON str."
    ),
    retriever_pb2.Document(
        id="csv.reader", title="csv.reader(f)", text="Return a reader over lines of a CSV file."
    ),
]
MAX_K = 5
MAX_QUESTION = 200
NO_ROOM = 2040  # max_new_tokens leaving 8 of the 2048 context tokens for the prompt
SMALL_MESSAGE_BYTES = 4096
StubCall = Callable[[retriever_pb2_grpc.RetrieverStub], Awaitable[Any]]


@pytest.fixture(scope="module")
def core() -> RetrieverCore:
    # max_new_tokens up to nearly the whole context, so a prompt can be left with no room
    limits = RequestLimits(max_k=MAX_K, max_m=MAX_K, max_question_chars=MAX_QUESTION, max_new_tokens=NO_ROOM)
    return RetrieverCore(settings(), embedder=shared_embedder(), tokenizer=shared_tokenizer(), limits=limits)


async def with_retriever(core: RetrieverCore, call: StubCall, max_message_bytes: int | None = None) -> Any:
    service = retriever_service(core)
    if max_message_bytes:
        service.max_message_bytes = max_message_bytes
    port = await service.serve(port=0)
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            return await call(retriever_pb2_grpc.RetrieverStub(channel))
    finally:
        await service.stop_serving(grace_s=1.0)


def run(core: RetrieverCore, call: StubCall, **kw: Any) -> Any:
    return asyncio.run(with_retriever(core, call, **kw))


def status_of(core: RetrieverCore, call: StubCall, **kw: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        run(core, call, **kw)
    return info.value.code(), info.value.details()


def ingest(stub: retriever_pb2_grpc.RetrieverStub, tenant: str = TENANT, docs: Any = DOCS) -> Awaitable[Any]:
    return stub.Ingest(retriever_pb2.IngestRequest(tenant=tenant, documents=docs))


def retrieve(stub: retriever_pb2_grpc.RetrieverStub, **kw: Any) -> Any:
    fields = {"tenant": TENANT, "question": "How do I write JSON?", **kw}
    return stub.Retrieve(retriever_pb2.RetrieveRequest(**fields))


def test_ingest_retrieve_stats_roundtrip(core: RetrieverCore) -> None:
    async def call(stub: retriever_pb2_grpc.RetrieverStub) -> Any:
        ingested = await ingest(stub)
        reply = await retrieve(stub, k=2, max_new_tokens=64)
        stats = await stub.Stats(retriever_pb2.RetrieverStatsRequest(tenant=TENANT))
        return ingested, reply, stats

    ingested, reply, stats = run(core, call)
    assert ingested.documents + 0 <= 2 and ingested.total_chunks == 2
    assert [c.doc_id for c in reply.chunks] == ["csv.reader", "json.dumps"]  # the prompt's order: by doc id
    top = reply.chunks[1]
    assert (top.chunk_id, top.text, top.start, top.end) == (
        "json.dumps#0",
        DOCS[0].text,
        0,
        len(DOCS[0].text),
    )
    assert top.score > reply.chunks[0].score  # the best match, shown second
    assert DOCS[0].text in reply.prompt and "How do I write JSON?" in reply.prompt
    assert list(reply.prompt_ids) == shared_tokenizer()(reply.prompt, add_special_tokens=False)["input_ids"]
    assert reply.tokenizer_id == core.tokenizer_id
    assert len(reply.prompt_ids) <= core.context_tokens - 64
    assert stats.chunks == 2 and TENANT in stats.tenants


def test_unknown_tenant_answers_without_documents_and_says_so(core: RetrieverCore) -> None:
    async def call(stub: retriever_pb2_grpc.RetrieverStub) -> Any:
        return await retrieve(stub, tenant="nobody")

    reply = run(core, call)
    assert len(reply.chunks) == 0 and len(reply.sessions) == 0
    assert "How do I write JSON?" in reply.prompt and reply.prompt_ids
    assert reply.unknown_tenant  # the typed contract the generator reads (NOT_FOUND for Answer)
    assert list(reply.notes) == ["tenant 'nobody' has no documents"]  # for people


def test_known_tenant_is_not_flagged_unknown(core: RetrieverCore) -> None:
    core.ingest("known-tenant", [Document(id="d1", title="JSON", text="json.dumps writes JSON text.")])

    async def call(stub: retriever_pb2_grpc.RetrieverStub) -> Any:
        return await retrieve(stub, tenant="known-tenant")

    reply = run(core, call)
    assert not reply.unknown_tenant and len(reply.chunks) == 1 and list(reply.notes) == []


def test_health_serving_and_reflection_lists_the_service(core: RetrieverCore) -> None:
    async def main() -> tuple[Any, list[str], Any]:
        service = retriever_service(core)
        port = await service.serve(port=0)
        try:
            async with open_channel(f"127.0.0.1:{port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                checks = [
                    (await health.Check(health_pb2.HealthCheckRequest(service=name))).status
                    for name in (SERVICE_NAME, "")
                ]
                refl = reflection_pb2_grpc.ServerReflectionStub(channel)
                request = reflection_pb2.ServerReflectionRequest(list_services="")
                names: list[str] = []
                async for resp in refl.ServerReflectionInfo(iter([request])):
                    names += [s.name for s in resp.list_services_response.service]
        finally:
            await service.stop_serving(grace_s=1.0)
        return checks, names, port

    checks, names, port = asyncio.run(main())
    assert checks == [health_pb2.HealthCheckResponse.SERVING] * 2
    assert SERVICE_NAME == "lookahead_rag.v1.Retriever" and SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names
    assert port > 0


BAD_RETRIEVE: list[tuple[str, dict[str, Any], str]] = [
    ("empty question", {"question": "   "}, "question is empty"),
    ("long question", {"question": "x" * (MAX_QUESTION + 1)}, f"the limit is {MAX_QUESTION}"),
    ("k too large", {"k": MAX_K + 1}, "k=6 is out of range"),
    ("m too large", {"m": MAX_K + 1}, "m=6 is out of range"),
    ("empty tenant", {"tenant": ""}, "tenant is empty"),
    ("no room for the prompt", {"max_new_tokens": NO_ROOM}, "shorten the question"),
    ("max_new_tokens over context", {"max_new_tokens": 100_000}, "max_new_tokens=100000 is out of range"),
]


@pytest.mark.parametrize(
    ("fields", "message"), [(f, m) for _, f, m in BAD_RETRIEVE], ids=[name for name, _, _ in BAD_RETRIEVE]
)
def test_bad_retrieve_is_invalid_argument(core: RetrieverCore, fields: dict[str, Any], message: str) -> None:
    code, details = status_of(core, lambda stub: retrieve(stub, **fields))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message in details and "\n" not in details


BAD_INGEST: list[tuple[str, str, list[retriever_pb2.Document], str]] = [
    ("empty tenant", "", DOCS, "tenant is empty"),
    ("no documents", TENANT, [], "no documents"),
    ("empty text", TENANT, [retriever_pb2.Document(id="a", text=" ")], "document 0 ('a'): empty text"),
    ("empty id", TENANT, [retriever_pb2.Document(id="", text="t")], "document 0: empty id"),
    ("duplicate id", TENANT, [DOCS[0], DOCS[0]], "appears twice"),
]


@pytest.mark.parametrize(
    ("tenant", "docs", "message"),
    [(t, d, m) for _, t, d, m in BAD_INGEST],
    ids=[name for name, _, _, _ in BAD_INGEST],
)
def test_bad_ingest_is_invalid_argument(core: RetrieverCore, tenant: str, docs: Any, message: str) -> None:
    code, details = status_of(core, lambda stub: ingest(stub, tenant, docs))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message in details


def test_oversize_message_is_resource_exhausted(core: RetrieverCore) -> None:
    big = [retriever_pb2.Document(id="big", text="y" * (2 * SMALL_MESSAGE_BYTES))]
    code, _ = status_of(core, lambda stub: ingest(stub, TENANT, big), max_message_bytes=SMALL_MESSAGE_BYTES)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED


# ---- shared plumbing: error mapping on unary and streaming methods, graceful stop ---------------------


def chunk(text: str) -> generator_pb2.AnswerChunk:
    return generator_pb2.AnswerChunk(delta=generator_pb2.TextDelta(text=text))


class FakeGenerator(generator_pb2_grpc.GeneratorServicer):
    """Answer (server-streaming) and Generate stand-ins that fail in chosen ways."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    @grpc_errors
    async def Answer(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        yield chunk("first")
        if request.question == "exhaust":
            raise ResourceExhausted("too many requests\nin flight")
        if request.question == "crash":
            raise KeyError("secret internals")
        if request.question == "slow":
            await self.release.wait()
        yield chunk("done")

    @grpc_errors
    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        raise InvalidArgument("bad prompt")
        yield  # an async generator that fails before its first message


async def with_fake(call: Callable[[generator_pb2_grpc.GeneratorStub, FakeGenerator], Awaitable[Any]]) -> Any:
    fake = FakeGenerator()
    name = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
    server, port = await start_server([(generator_pb2_grpc.add_GeneratorServicer_to_server, fake)], [name])
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            return await call(generator_pb2_grpc.GeneratorStub(channel), fake)
    finally:
        await stop_server(server, grace_s=1.0)


async def collect(stream: Any) -> list[str]:
    return [item.delta.text async for item in stream]


@pytest.mark.parametrize(
    ("question", "code", "details"),
    [
        ("exhaust", grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests in flight"),
        ("crash", grpc.StatusCode.INTERNAL, "internal error: KeyError: 'secret internals'"),
    ],
)
def test_errors_in_a_stream_map_to_status(question: str, code: grpc.StatusCode, details: str) -> None:
    async def call(stub: generator_pb2_grpc.GeneratorStub, fake: FakeGenerator) -> tuple[list[str], Any]:
        received: list[str] = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for item in stub.Answer(generator_pb2.AnswerRequest(question=question)):
                received.append(item.delta.text)
        return received, info.value

    received, error = asyncio.run(with_fake(call))
    assert received == ["first"]
    assert (error.code(), error.details()) == (code, details)


def test_error_before_first_message_maps_to_status() -> None:
    async def call(stub: generator_pb2_grpc.GeneratorStub, fake: FakeGenerator) -> Any:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(stub.Generate(generator_pb2.GenerateRequest()))
        return info.value

    error = asyncio.run(with_fake(call))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad prompt")


def test_graceful_stop_finishes_in_flight_stream_and_goes_not_serving() -> None:
    async def main() -> tuple[list[str], list[Any], Any]:
        fake = FakeGenerator()
        name = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
        server, port = await start_server(
            [(generator_pb2_grpc.add_GeneratorServicer_to_server, fake)], [name]
        )
        async with open_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=name))
            statuses = [(await watch.read()).status]
            stream = generator_pb2_grpc.GeneratorStub(channel).Answer(
                generator_pb2.AnswerRequest(question="slow")
            )
            first = await stream.read()  # the call is in flight now
            stopping = asyncio.create_task(stop_server(server, grace_s=30.0))
            statuses.append((await watch.read()).status)  # shutdown began: health flips first
            watch.cancel()  # a watcher would otherwise hold the server for the whole grace period
            fake.release.set()
            rest = []
            while (item := await stream.read()) is not grpc.aio.EOF:
                rest.append(item.delta.text)
            await stopping
            return [first.delta.text, *rest], statuses, await stream.code()

    texts, statuses, code = asyncio.run(main())
    assert texts == ["first", "done"]
    assert code is grpc.StatusCode.OK
    assert statuses == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING]


def test_grpc_errors_rejects_sync_methods() -> None:
    with pytest.raises(TypeError, match="async"):
        grpc_errors(lambda self, request, context: None)
