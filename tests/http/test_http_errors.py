"""The endpoint's refusals and their HTTP statuses (the mapping in services/http/errors.py), overload,
deadlines, and a client that goes away mid-stream.

One pipeline for the module that runs one request at a time with no waiting queue, so a request
held in its step (``ForwardGate``) makes the next one an overload. Every refusal leaves nothing in
flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import openai
import pytest

from tests.http.helpers import ask, model, openai_client, raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, collect, module_loop, module_pipeline, wait_until
from tests.pipeline.spies import ForwardGate, SubmitSpy, ended

pytestmark = module_loop

MAX_NEW = 64  # [limits] max_new_tokens
DEADLINE_S = 3.0
STREAM_DEADLINE_S = 10.0  # room for retrieval and the first token on a loaded machine

pipe = module_pipeline(generator={"max_running": 1, "max_waiting": 0},
                       limits={"max_new_tokens": MAX_NEW, "default_max_new_tokens": MAX_NEW // 2})


def error_of(exc: openai.APIError) -> dict[str, Any]:
    assert isinstance(exc.body, dict), exc.body  # the client unwraps {"error": {...}}
    return exc.body


# case -> (create() arguments, words the one-line message must hold)
BAD_REQUESTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # the engine's own check, as over gRPC
    "negative temperature": ({"temperature": -1.0}, ("temperature", ">= 0")),
    "top_p over 1": ({"temperature": 0.7, "top_p": 1.5}, ("top_p",)),
    # (max_tokens over the limit is clamped, not refused: tests/http/test_http_conversation.py)
    "empty stop string": ({"stop": ["\n", ""]}, ("empty stop string",)),
    # what the proto cannot carry
    "max_tokens 0": ({"max_tokens": 0}, ("max_tokens", "at least 1")),
    "negative seed": ({"seed": -1}, ("seed=-1",)),
    # OpenAI features we cannot honour
    "n > 1": ({"n": 2}, ("n=2",)),
    "top_logprobs over 20": ({"logprobs": True, "top_logprobs": 21}, ("top_logprobs",)),
    "tools": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, ("tools",)),
    "frequency_penalty": ({"frequency_penalty": 0.5}, ("frequency_penalty",)),
    "json response_format": ({"response_format": {"type": "json_object"}}, ("response_format",)),
    # the messages: RAG needs a user question, and only text
    "no user message": ({"messages": [{"role": "system", "content": "hi"}]}, ("no user message",)),
    "image content": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, ("only text", "image_url")),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_bad_request_is_400(pipe: RunningPipeline, tenant: str, case: str) -> None:
    fields, words = BAD_REQUESTS[case]
    fields = {"messages": ask(QUESTION), **fields}
    async with openai_client(pipe, tenant) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=model(pipe), **fields)
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_argument"
    assert "\n" not in error["message"] and all(w in error["message"] for w in words), error
    assert pipe.inflight == 0


# case -> (raw request body, a word the message must hold)
MALFORMED: dict[str, tuple[bytes, str]] = {
    "not JSON": (b'{"messages": [', "JSON"),
    "messages missing": (b'{"model": "x"}', "messages"),
    "wrong type": (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}', "max_tokens"),
    "empty messages": (b'{"messages": []}', "messages"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_body_is_400_not_422(pipe: RunningPipeline, tenant: str, case: str) -> None:
    body, word = MALFORMED[case]
    async with raw_client(pipe) as http:
        response = await http.post("/v1/chat/completions", content=body,
                                   headers={"x-tenant": tenant, "content-type": "application/json"})
    # FastAPI's validation error, reshaped: 400 and OpenAI's error body
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and word in error["message"], error


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_tenant_is_404(pipe: RunningPipeline, stream: bool) -> None:
    async with openai_client(pipe, "never-ingested") as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=2,
                                                 stream=stream)
    # the engine's NotFound, before any byte of a stream: a real 404 either way
    assert error_of(caught.value)["code"] == "not_found" and "unknown tenant" in error_of(caught.value)["message"]
    assert pipe.inflight == 0


async def test_missing_tenant_header_is_400(pipe: RunningPipeline) -> None:
    async with openai_client(pipe) as client:  # no x-tenant and no [http] default_tenant
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION))
    assert "x-tenant" in error_of(caught.value)["message"]


async def test_unknown_model_is_404(pipe: RunningPipeline, tenant: str) -> None:
    async with openai_client(pipe, tenant) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="gpt-4o", messages=ask(QUESTION))
    # one model is served; another name is not silently answered by it
    assert "gpt-4o" in error_of(caught.value)["message"]


async def test_bad_timeout_header_is_400(pipe: RunningPipeline, tenant: str) -> None:
    async with openai_client(pipe, tenant, **{"x-request-timeout": "soon"}) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION))
    assert "x-request-timeout" in error_of(caught.value)["message"]


async def test_unknown_path_is_404_in_openai_shape(pipe: RunningPipeline) -> None:
    async with raw_client(pipe) as http:
        response = await http.get("/v1/embeddings")
    assert response.status_code == 404 and response.json()["error"]["message"]


async def test_overload_is_429(pipe: RunningPipeline, tenant: str) -> None:
    n = 8
    with ForwardGate(pipe.generator.scheduler.backend.kernels, block_at=2) as gate:
        held = pipe.stub.Answer(pipe.answer_request(tenant, max_new_tokens=n), timeout=300)
        await held.read()
        assert await gate.wait_reached()  # the one running place is taken, and nothing may wait
        async with openai_client(pipe, tenant) as client:
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=n)
        gate.release()
        rest = await collect(held)
    # refused at once with 429, and the held request is unaffected
    assert error_of(caught.value)["code"] == "resource_exhausted" and "overloaded" in error_of(caught.value)["message"]
    assert rest.final is not None and rest.final.stats.new_tokens == n
    assert await pipe.wait_idle() == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_cancels_the_request(pipe: RunningPipeline, tenant: str, stream: bool) -> None:
    scheduler = pipe.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=3) as gate:
        async with openai_client(pipe, tenant) as client:
            call = asyncio.create_task(client.chat.completions.create(
                model=model(pipe), messages=ask(QUESTION), max_tokens=MAX_NEW, stream=stream))
            if stream:
                chunks = await call
                first = await anext(aiter(chunks))
                assert first.choices[0].delta.role == "assistant"
            assert await gate.wait_reached()  # decoding is held mid-answer
            (req,) = spy.requests
            if stream:
                await chunks.close()  # the client goes away mid-stream
            else:
                call.cancel()  # the client gives up waiting for the whole answer
                with contextlib.suppress(asyncio.CancelledError):
                    await call
            # the server saw it and told the scheduler, while the step was still held
            assert await wait_until(req.cancelled.is_set)
        gate.release()
        assert await wait_until(lambda: ended(req))
    assert await pipe.wait_idle() == 0  # the engine's in-flight count is back to 0
    assert req.stats.finish_reason == "cancelled" and len(req.output) < MAX_NEW
    await pipe.drain()
    assert pipe.events.for_tenant(tenant) == []  # a cancelled answer is not published


async def test_deadline_header_is_504(pipe: RunningPipeline, tenant: str) -> None:
    scheduler = pipe.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=2) as gate:
        async with openai_client(pipe, tenant, **{"x-request-timeout": str(DEADLINE_S)}) as client:
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=MAX_NEW)
        req = spy.last()
        if req is not None:  # decoding had started: it is told to stop
            assert await wait_until(req.cancelled.is_set)
        gate.release()
    # the deadline passed while decoding was held: 504, and the request stopped
    assert caught.value.status_code == 504 and error_of(caught.value)["code"] == "deadline_exceeded"
    assert await pipe.wait_idle() == 0


async def test_deadline_mid_stream_is_an_error_event(pipe: RunningPipeline, tenant: str) -> None:
    scheduler = pipe.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=3) as gate:
        async with openai_client(pipe, tenant, **{"x-request-timeout": str(STREAM_DEADLINE_S)}) as client:
            chunks = await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION),
                                                          max_tokens=MAX_NEW, stream=True)
            with pytest.raises(openai.APIError) as caught:
                async for _ in chunks:
                    pass
        (req,) = spy.requests
        assert await wait_until(req.cancelled.is_set)
        gate.release()
    # the status line was out (200): the 504 comes as a data: {"error": ...} event, and decoding stopped
    assert not isinstance(caught.value, openai.APIStatusError)
    assert error_of(caught.value)["code"] == "deadline_exceeded"
    assert await pipe.wait_idle() == 0
