"""JSON logs: every line of a gRPC request carries its request id and tenant, never its text at INFO."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.telemetry.logs import (
    REQUEST_ID_HEADER,
    bind_tenant,
    current_request_id,
    log_text,
    outgoing_metadata,
    request_context,
    sensitive,
    setup_logging,
)
from lookahead_rag.services.common.telemetry.observability import ObservabilityInterceptor

LOGGER = "test.ops.logging"
log = logging.getLogger(LOGGER)
QUESTION = "Which secret question did tenant {t} ask?"
ANSWER = "The confidential answer for {t}."
PROMPT = "SYSTEM PROMPT with private documents of {t}"
ASK = "/opstest.Log/Ask"


async def _ask(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    tenant = request.decode()
    bind_tenant(tenant)
    log.info("question received", extra={"question": QUESTION.format(t=tenant), "question_chars": 40})
    await asyncio.sleep(0.01)  # interleave with the other request

    async def downstream() -> None:  # a task started by the handler inherits the request context
        log.info("calling the retriever", extra={"metadata": dict(outgoing_metadata())})

    await asyncio.create_task(downstream())
    log_text(log, PROMPT.format(t=tenant), label="prompt")
    log.info("answered: %s", sensitive(ANSWER.format(t=tenant)))
    log.warning("done", extra={"answer": ANSWER.format(t=tenant)})
    return b"ok"


HANDLER = grpc.method_handlers_generic_handler("opstest.Log", {"Ask": grpc.unary_unary_rpc_method_handler(_ask)})


async def two_requests(with_id: bool = True) -> None:
    server = grpc.aio.server(interceptors=[ObservabilityInterceptor(CollectorRegistry())])
    server.add_generic_rpc_handlers((HANDLER,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ask = channel.unary_unary(ASK)

            def call(tenant: str, rid: str) -> grpc.aio.UnaryUnaryCall:
                return ask(tenant.encode(), metadata=((REQUEST_ID_HEADER, rid),) if with_id else None)

            await asyncio.gather(call("acme", "req-acme"), call("beta", "req-beta"))
    finally:
        await server.stop(None)


@pytest.fixture
def capture() -> Iterator[tuple[io.StringIO, list]]:
    root = logging.getLogger()
    level, stream = root.level, io.StringIO()
    handlers: list[logging.Handler] = []
    yield stream, handlers
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if line["logger"] == LOGGER]


def test_every_line_of_a_request_has_its_id_and_tenant_and_no_text_at_info(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("INFO", stream=stream))
    asyncio.run(two_requests())
    out = lines(stream)
    assert len(out) == 8, out  # 4 per request; log_text wrote nothing at INFO
    for line in out:
        assert list(line)[:6] == ["ts", "level", "logger", "msg", "request_id", "tenant"]
        assert (line["request_id"], line["tenant"]) in {("req-acme", "acme"), ("req-beta", "beta")}
    by_request = {rid: [x for x in out if x["request_id"] == rid] for rid in ("req-acme", "req-beta")}
    for rid, tenant in (("req-acme", "acme"), ("req-beta", "beta")):
        assert [x["msg"].split(":")[0] for x in by_request[rid]] == [
            "question received", "calling the retriever", "answered", "done"
        ]
        assert by_request[rid][1]["metadata"] == {REQUEST_ID_HEADER: rid}  # passed on downstream
        assert by_request[rid][0]["question"] == f"<{len(QUESTION.format(t=tenant))} chars>"
        assert by_request[rid][0]["question_chars"] == 40  # other extras stay
    text = stream.getvalue()
    for tenant in ("acme", "beta"):
        for secret in (QUESTION, ANSWER, PROMPT):
            assert secret.format(t=tenant) not in text


def test_text_appears_only_at_debug(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("DEBUG", stream=stream))
    asyncio.run(two_requests())
    out = lines(stream)
    prompts = [x for x in out if x["level"] == "DEBUG"]
    assert [x["msg"] for x in prompts if x["tenant"] == "acme"] == ["prompt: " + PROMPT.format(t="acme")]
    assert all(x["request_id"] == f"req-{x['tenant']}" for x in prompts)
    info_text = "\n".join(json.dumps(x) for x in out if x["level"] != "DEBUG")
    assert ANSWER.format(t="acme") not in info_text  # INFO and WARNING lines stay redacted


def test_request_id_is_made_when_the_caller_sends_none(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("INFO", stream=stream))
    asyncio.run(two_requests(with_id=False))
    ids = {x["request_id"] for x in lines(stream)}
    assert len(ids) == 2 and all(isinstance(i, str) and len(i) == 32 for i in ids)


def test_outside_a_request_and_context_nesting(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("INFO", stream=stream))
    log.info("startup")
    with request_context("outer", "t1") as rid:
        assert rid == current_request_id() == "outer"
        with request_context(tenant="t2") as inner:  # a nested scope stays on the request's id
            log.info("inner")
        with request_context() as same, request_context("explicit"):  # an explicit id replaces it
            log.info("explicit")
        log.info("outer again")
    assert current_request_id() is None
    with request_context() as fresh:
        pass
    first, second, third, fourth = lines(stream)
    assert (first["request_id"], first["tenant"]) == (None, None)
    assert (second["request_id"], second["tenant"]) == ("outer", "t2") and inner == same == "outer"
    assert (third["request_id"], third["tenant"]) == ("explicit", "t1")
    assert (fourth["request_id"], fourth["tenant"]) == ("outer", "t1")
    assert fresh not in ("outer", "explicit") and len(fresh) == 32  # outside a request: a new id


def test_text_format_carries_the_request_and_redacts(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("INFO", json=False, stream=stream))
    with request_context("req-1", "acme"):
        log.info("answer %s", sensitive("very private words"))
    line = stream.getvalue().strip()
    assert "[req-1 acme]" in line and "<18 chars>" in line and "private" not in line


def test_text_format_keeps_a_hostile_tenant_on_one_line(capture) -> None:
    # a tenant (or message) with a line break must not forge a second log line in text format
    stream, handlers = capture
    handlers.append(setup_logging("INFO", json=False, stream=stream))
    with request_context("req-2", "evil\n2026-01-01 INFO forged: ok"):
        log.info("asked %s", "a\r\nb")
    text = stream.getvalue()
    assert text.count("\n") == 1  # one record, one line
    assert "[req-2 evil\\x0a2026-01-01 INFO forged: ok]" in text and "asked a\\x0d\\x0ab" in text


def test_setup_logging_replaces_its_own_handler(capture) -> None:
    stream, handlers = capture
    handlers.append(setup_logging("INFO", stream=io.StringIO()))
    handlers.append(setup_logging("INFO", stream=stream))
    root = logging.getLogger()
    assert handlers[0] not in root.handlers and handlers[1] in root.handlers
    log.info("once")
    assert len(lines(stream)) == 1
