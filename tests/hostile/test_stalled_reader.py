"""A client that stops reading without disconnecting (issue 22, item 3) must not keep its request's
place, trie, drafting state and draft-model cache, or its tenant's stream slot, for ever.

A send waits while the client's flow-control window is full. Past ``[generator] stream_send_timeout_s``
the stream ends and its request is cancelled in the engine (gRPC: DEADLINE_EXCEEDED, which waits
behind the data the client has not read; HTTP: the connection is closed, no ``data: [DONE]``). And
whatever a request holds is freed when the engine's request ends, not when its stream's last send does.

The stalled clients are real. gRPC: a channel whose flow-control window is only what it has read
(``grpc.http2.lookahead_bytes`` 0, no BDP probing), so the server's second message waits. HTTP: a socket
with a small receive buffer, to a listener with a small send buffer, reading a safe stream whose one
padded delta event (about 100 kB with 256-token chunks) outgrows uvicorn's write buffer, so the next
send waits. ``ForwardGate`` holds a request mid-answer while its stream stalls, without timing. Two
tests stall at the layer below: the servicer, with a context whose write never returns, and the
engine's own stream, read once and then left (as a consumer waiting on a send leaves it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from lookahead_core.engine.request import ServeRequest
from lookahead_core.proposers.draft_model import DraftModelProposer

from lookahead_rag.services.common.rules.quota import Quota, TenantQuotas
from lookahead_rag.services.generator.domain import AnswerQuery, FinalInfo, GenerationParams, TextDelta
from lookahead_rag.services.generator.servicer import GeneratorServicer
from lookahead_rag.services.http.streaming import DONE
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc
from tests.core.peek import proposer_of
from tests.http.helpers import TENANT_HEADER, ask, model
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    QUESTION,
    RunningPipeline,
    assert_status,
    collect,
    module_loop,
    module_pipeline,
    rpc_error,
    unique_tenant,
    wait_until,
)
from tests.pipeline.spies import ForwardGate, SubmitSpy, ended

pytestmark = module_loop

SEND_TIMEOUT_S = 1.0  # [generator] stream_send_timeout_s of this module's pipeline
STALL_WAIT_S = 60.0  # how long a test waits for the server to give a stalled stream up (old code: never)
LONG_ANSWER = 64  # tokens asked for an answer that is still decoding when its stream stalls
SHORT_ANSWER = 8  # tokens asked for an answer that ends while its stream stalls
HELD_FORWARD = 3  # prefill (first delta, read), a step (second delta, stalled), then this one is held
SOCKET_BUFFER_BYTES = 4096  # the HTTP client's receive buffer and the listener's send buffer
SAFE_CHUNK_TOKENS = 256  # a safe stream's chunk: its padded event is ~100 kB, past uvicorn's 64 kB write buffer
SAFE_INTERVAL_MS = 10.0  # a safe stream's cadence: fast, nothing here is about timing
HEAD_END = b"\r\n\r\n"  # where an HTTP response's head ends
HEAD_END_BYTES = 1  # the head is read a byte at a time: nothing of the body is read with it
READ_BYTES = 1 << 16  # one read of the rest of a response
STALLING_CHANNEL = [("grpc.http2.lookahead_bytes", 0), ("grpc.http2.bdp_probe", 0)]  # window: what was read
ONE_STREAM = {"streams": 1}
GRPC, ENDED, FAKE, HTTP, ENGINE = (unique_tenant(f"stalled-{n}") for n in ("grpc", "ended", "fake", "http", "engine"))

pipe = module_pipeline(
    generator={"stream_send_timeout_s": SEND_TIMEOUT_S, "safe_stream_tenants": [HTTP],
               "tenant_modes": {t: ["draft-model"] for t in (GRPC, ENDED, FAKE, ENGINE)},  # the draft-model cases
               "safe_stream_chunk_tokens": SAFE_CHUNK_TOKENS, "safe_stream_interval_ms": SAFE_INTERVAL_MS},
    limits={"tenant_quotas": {t: ONE_STREAM for t in (GRPC, ENDED, FAKE, HTTP, ENGINE)}},
)


def stalling_stub(p: RunningPipeline) -> tuple[grpc.aio.Channel, generator_pb2_grpc.GeneratorStub]:
    channel = grpc.aio.insecure_channel(p.target(), options=STALLING_CHANNEL)
    return channel, generator_pb2_grpc.GeneratorStub(channel)


class WeakSubmits:
    """Weak references to every ServeRequest the engine is handed (the spy itself keeps none alive)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._orig = scheduler.submit
        self.refs: list[weakref.ref[ServeRequest]] = []

    def _submit(self, req: ServeRequest) -> None:
        self._orig(req)
        self.refs.append(weakref.ref(req))

    def __enter__(self) -> WeakSubmits:
        self.scheduler.submit = self._submit
        return self

    def __exit__(self, *exc: object) -> None:
        del self.scheduler.submit


def holdings(req: ServeRequest | None) -> list[weakref.ref[Any]]:
    """Weak references to what a running request holds: its ticket, its trie, its draft model's cache."""
    assert req is not None
    draft = proposer_of(req, DraftModelProposer)
    assert draft is not None, "the request was to draft with a draft model"
    return [weakref.ref(req), weakref.ref(req.trie), weakref.ref(draft.cache)]


def all_freed(refs: list[weakref.ref[Any]]) -> Callable[[], bool]:
    return lambda: all(ref() is None for ref in refs)


async def test_a_grpc_client_that_stops_reading_is_cancelled_past_the_send_timeout(pipe: RunningPipeline) -> None:
    quotas, scheduler = pipe.generator.quotas, pipe.generator.scheduler
    pipe.ingest(GRPC)
    channel, stub = stalling_stub(pipe)
    async with channel:
        with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=HELD_FORWARD) as gate:
            call = stub.Answer(pipe.answer_request(GRPC, max_new_tokens=LONG_ANSWER), timeout=CALL_TIMEOUT_S)
            try:
                assert (await call.read()).HasField("delta")  # read once, then never again
                assert await gate.wait_reached()  # mid-answer; its second delta waits on the client's window
                assert await wait_until(lambda: quotas.open_streams(GRPC) == 0, STALL_WAIT_S), "the slot is held"
                gate.release()
                req = spy.last()
                assert req is not None and await wait_until(lambda: ended(req))
                assert req.stats.finish_reason == "cancelled" and len(req.output) < LONG_ANSWER
                err = await rpc_error(lambda: collect(call))  # reading again: what was sent, then the status
                assert_status(err, grpc.StatusCode.DEADLINE_EXCEEDED, "stream_send_timeout_s")
            finally:
                call.cancel()
    assert await pipe.wait_idle() == 0
    assert (await pipe.answer(GRPC, max_new_tokens=2)).final is not None  # its one stream slot is free again


async def test_a_request_that_ends_while_its_grpc_client_stalls_holds_nothing(
        pipe: RunningPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    # the send outlasts the answer
    monkeypatch.setattr(pipe.generator.settings, "stream_send_timeout_s", CALL_TIMEOUT_S)
    scheduler = pipe.generator.scheduler
    pipe.ingest(ENDED)
    channel, stub = stalling_stub(pipe)
    async with channel:
        with (WeakSubmits(scheduler) as submits,
              ForwardGate(scheduler.backend.kernels, block_at=HELD_FORWARD - 1) as gate):
            request = pipe.answer_request(ENDED, max_new_tokens=SHORT_ANSWER, mode="draft-model")
            call = stub.Answer(request, timeout=CALL_TIMEOUT_S)
            try:
                first = await call.read()
                assert await gate.wait_reached()  # running: what it holds is there to be seen
                held = holdings(submits.refs[-1]())
                gate.release()
                # the answer ends while the server's second write still waits: nothing of it is held any more
                assert await wait_until(all_freed(held), STALL_WAIT_S), [ref() for ref in held]
                assert pipe.generator.quotas.open_streams(ENDED) == 0
                rest = await collect(call)  # the client reads again: the whole answer
            finally:
                call.cancel()
    assert rest.final is not None and rest.final.stats.finish_reason != "cancelled"
    assert [*first.delta.token_ids, *rest.streamed_ids] == list(rest.final.output_ids)


async def test_the_engine_frees_a_request_when_it_ends_not_when_its_consumer_reads_on(pipe: RunningPipeline) -> None:
    # the engine's stream, its consumer taking one chunk and then none for now (as while a send waits)
    scheduler = pipe.generator.scheduler
    pipe.ingest(ENGINE)
    query = AnswerQuery(ENGINE, QUESTION, GenerationParams(max_new_tokens=SHORT_ANSWER, mode="draft-model"))
    with WeakSubmits(scheduler) as submits, ForwardGate(scheduler.backend.kernels, block_at=HELD_FORWARD - 1) as gate:
        chunks = pipe.generator.answer(query)
        try:
            first = await anext(chunks)
            assert await gate.wait_reached()  # running: what it holds is there to be seen
            held = holdings(submits.refs[-1]())
            gate.release()
            assert await wait_until(all_freed(held), STALL_WAIT_S), [ref() for ref in held]
            assert pipe.generator.quotas.open_streams(ENGINE) == 0
            rest = [chunk async for chunk in chunks]  # the consumer reads on: the whole answer
        finally:
            await chunks.aclose()
    final = rest[-1]
    assert isinstance(first, TextDelta) and isinstance(final, FinalInfo) and final.stats.finish_reason != "cancelled"
    assert [t for d in (first, *rest[:-1]) for t in d.token_ids] == list(final.output_ids)


async def test_a_stream_slot_is_freed_once_however_early_it_is_released() -> None:
    quotas = TenantQuotas(Quota(streams=1))
    with quotas.admit(ENGINE) as release:
        release()  # the request ended; its consumer may still be sending
        assert quotas.open_streams(ENGINE) == 0
        with quotas.admit(ENGINE):  # the slot is the next stream's at once
            release()  # once: a second release frees nothing
            assert quotas.open_streams(ENGINE) == 1
    assert quotas.open_streams(ENGINE) == 0


class StalledContext:
    """A grpc.aio ServicerContext whose client took the first message and then reads nothing: every
    later write waits for ever, and so does a status (it would queue behind them)."""

    def __init__(self) -> None:
        self.written: list[generator_pb2.AnswerChunk] = []
        self.status: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float | None:
        return None

    async def write(self, message: generator_pb2.AnswerChunk) -> None:
        if self.written:
            await asyncio.Event().wait()
        self.written.append(message)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.status = (code, details)
        await asyncio.Event().wait()


async def test_a_write_that_never_returns_ends_the_call_and_its_request(pipe: RunningPipeline) -> None:
    scheduler = pipe.generator.scheduler
    pipe.ingest(FAKE)
    servicer, context = GeneratorServicer(pipe.generator), StalledContext()
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=HELD_FORWARD) as gate:
        answering = asyncio.ensure_future(
            servicer.Answer(pipe.answer_request(FAKE, max_new_tokens=LONG_ANSWER), context))
        assert await gate.wait_reached()  # mid-answer, its second write waiting
        started = time.monotonic()
        await asyncio.wait({answering}, timeout=STALL_WAIT_S)
        assert answering.done(), "the call still waits on its write"
        assert answering.result() is None
        assert time.monotonic() - started < STALL_WAIT_S
        assert pipe.generator.quotas.open_streams(FAKE) == 0
        gate.release()
    req = spy.last()
    assert req is not None and await wait_until(lambda: ended(req))
    assert req.stats.finish_reason == "cancelled" and len(req.output) < LONG_ANSWER
    assert context.status is not None and context.status[0] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "stream_send_timeout_s" in context.status[1] and len(context.written) == 1


@pytest.fixture
def small_send_buffers(pipe: RunningPipeline) -> Iterator[None]:
    """The HTTP listener's send buffer made small (accepted sockets inherit it: no autotuning to MiBs)."""
    assert pipe.pipeline.http is not None
    sockets = [s for server in pipe.pipeline.http.server.servers for s in server.sockets]
    before = [s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) for s in sockets]
    for s in sockets:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    yield
    for s, size in zip(sockets, before, strict=True):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def stalled_post(p: RunningPipeline, path: str, body: dict[str, Any], headers: dict[str, str]
                       ) -> tuple[socket.socket, bytes]:
    """POST ``body`` from a socket whose receive buffer is small (set before it connects, so the window it
    offers stays small); returns the socket and the response's head, read, after which nothing is."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", p.pipeline.http_port))
    content = json.dumps(body).encode()
    fields = {"host": "127.0.0.1", "content-type": "application/json", "content-length": str(len(content)), **headers}
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    await loop.sock_sendall(sock, f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + content)
    received = b""
    while HEAD_END not in received:
        received += await asyncio.wait_for(loop.sock_recv(sock, HEAD_END_BYTES), CALL_TIMEOUT_S)
    return sock, received


async def read_to_close(sock: socket.socket) -> tuple[bytes, bool]:
    """The rest of the response: up to the server closing the connection (True), or up to its
    ``data: [DONE]`` (False: the stream ended whole)."""
    loop = asyncio.get_running_loop()
    received = b""
    while DONE not in received:
        data = await asyncio.wait_for(loop.sock_recv(sock, READ_BYTES), CALL_TIMEOUT_S)
        if not data:
            return received, True
        received += data
    return received, False


async def test_an_http_client_that_stops_reading_has_its_stream_closed(
        pipe: RunningPipeline, small_send_buffers: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lookahead_rag.services.http.streaming")
    pipe.ingest(HTTP)
    body = {"model": model(pipe), "messages": ask(QUESTION), "max_tokens": SHORT_ANSWER, "stream": True}

    def gave_up() -> bool:
        return any("stream ended" in r.getMessage() for r in caplog.records)

    sock, head = await stalled_post(pipe, "/v1/chat/completions", body, {TENANT_HEADER: HTTP})
    with sock:
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        # its first event, a safe stream's padded delta, fills every buffer: the next send waits
        assert await wait_until(gave_up, STALL_WAIT_S), "the server still waits on its send"
        assert pipe.generator.quotas.open_streams(HTTP) == 0
        received, closed = await read_to_close(sock)  # reading again: what was sent, then the close
    assert closed and DONE not in head + received
    assert await pipe.wait_idle() == 0
