"""Faults around the generator over real gRPC (loopback, port 0): the draft cache or the retriever
stopped mid-run or too slow for its deadline, and a graceful shutdown with a stream in flight.

An accelerating part failing never fails a request or changes its tokens: the answer is still
plain greedy decoding of the prompt it was given, and the final stats say what was missing. Each
test stops parts of the pipeline, so each gets a pipeline of its own (the model is shared).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest_asyncio
from grpc_health.v1 import health_pb2

from lookahead_rag.services.generator.servicer import SERVICE_NAME as GENERATOR_SERVICE
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    QUESTION,
    STOP_TIMEOUT_S,
    Answered,
    RunningPipeline,
    collect,
    greedy,
    module_loop,
    rpc_error,
    running_pipeline,
    wait_until,
)
from tests.pipeline.spies import ForwardGate

pytestmark = module_loop

N = 24
SERVING = health_pb2.HealthCheckResponse.SERVING
SHORT_TIMEOUT_S = 1.0  # the slow-dependency pipeline's retrieve and fetch deadlines
SLOW_S = 30.0  # a slow dependency holds its reply this long at most (released when the test ends)


@pytest_asyncio.fixture(loop_scope="module")
async def fresh(tmp_path: Path) -> AsyncIterator[RunningPipeline]:
    async with running_pipeline(tmp_path / "faults") as p:
        yield p


async def down(p: RunningPipeline, service: str) -> bool:
    """Whether ``service``'s gRPC server no longer answers (health check refused)."""
    try:
        await p.health("", p.target(service))
    except grpc.RpcError as err:
        return err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    return False


async def not_serving(p: RunningPipeline) -> bool:
    """Whether the generator has begun shutting down (health NOT_SERVING or refused)."""
    try:
        return await p.health(GENERATOR_SERVICE) != SERVING
    except grpc.RpcError:
        return True


def fallback_prompt(p: RunningPipeline, question: str) -> list[int]:
    out = p.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                          tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def assert_greedy(p: RunningPipeline, got: Answered, n: int = N) -> None:
    assert got.final is not None
    assert got.text == got.final.answer_text
    assert list(got.final.output_ids) == greedy(p.model, got.final.prompt_ids, n)


async def answer_while_stopping(p: RunningPipeline, tenant: str, stop: Callable[[], Awaitable[None]]) -> Answered:
    """Answer with ``stop`` run while the request is decoding (its forward held at a gate)."""
    with ForwardGate(p.generator.scheduler.backend.kernels, block_at=2) as gate:
        call = p.stub.Answer(p.answer_request(tenant, max_new_tokens=N), timeout=CALL_TIMEOUT_S)
        first = await call.read()
        assert await gate.wait_reached()
        await stop()
        gate.release()
        rest = await collect(call)
    rest.deltas.insert(0, first.delta)
    return rest


async def test_draft_cache_stopped_mid_run(fresh: RunningPipeline, tenant_name: str) -> None:
    p, tenant = fresh, tenant_name
    p.ingest(tenant)
    warm = await p.answer(tenant, max_new_tokens=N)
    await p.drain()  # the tenant's draft cache now holds this answer
    assert warm.final is not None and warm.final.stats.drafts_available

    async def stop_draft_cache() -> None:
        await p.pipeline.services["draftcache"].stop(0)
        assert await down(p, "draftcache")

    during = await answer_while_stopping(p, tenant, stop_draft_cache)
    assert_greedy(p, during)  # it had fetched its drafts before the cache went away
    assert during.final is not None and during.final.stats.drafts_available

    after = await p.answer(tenant, max_new_tokens=N)
    assert_greedy(p, after)
    assert after.final is not None
    stats = after.final.stats
    assert not stats.drafts_available and stats.draft_tokens_from_cache == 0
    assert stats.documents_available and after.final.documents
    assert await p.health(GENERATOR_SERVICE) == SERVING


async def test_retriever_stopped_mid_run(fresh: RunningPipeline, tenant_name: str) -> None:
    p, tenant = fresh, tenant_name
    p.ingest(tenant)
    retriever = p.pipeline.services["retriever"]

    async def stop_retriever() -> None:
        await retriever.stop_serving(0)
        assert await down(p, "retriever")
        assert await p.health(GENERATOR_SERVICE) == SERVING  # only the retriever's server stopped

    during = await answer_while_stopping(p, tenant, stop_retriever)
    assert_greedy(p, during)
    assert during.final is not None and during.final.stats.documents_available and during.final.documents

    question = "How do I read the rows of a CSV file?"
    after = await p.answer(tenant, question=question, max_new_tokens=N)
    assert_greedy(p, after)
    assert after.final is not None
    assert not after.final.stats.documents_available and not after.final.documents
    assert list(after.final.prompt_ids) == fallback_prompt(p, question)  # the question alone
    assert after.final.stats.drafts_available


async def test_dependencies_past_their_deadline(tmp_path: Path, tenant_name: str) -> None:
    tenant = tenant_name
    gen = {"retrieve_timeout_s": SHORT_TIMEOUT_S, "fetch_timeout_s": SHORT_TIMEOUT_S}
    release = threading.Event()

    def slow(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            release.wait(SLOW_S)
            return method(*args, **kwargs)
        return wrapper

    async with running_pipeline(tmp_path / "slow", generator=gen) as p:
        p.ingest(tenant)
        retriever, store = p.pipeline.retriever, p.pipeline.draftcache
        retriever.retrieve, store.fetch = slow(retriever.retrieve), slow(store.fetch)  # shadow the methods
        try:
            got = await p.answer(tenant, max_new_tokens=N)
        finally:
            release.set()
            del retriever.retrieve, store.fetch
        assert_greedy(p, got)
        assert got.final is not None
        assert not got.final.stats.documents_available and not got.final.stats.drafts_available
        assert list(got.final.prompt_ids) == fallback_prompt(p, QUESTION)


async def test_graceful_shutdown_finishes_the_stream_in_flight(fresh: RunningPipeline, tenant_name: str) -> None:
    p, tenant = fresh, tenant_name
    p.ingest(tenant)
    with ForwardGate(p.generator.scheduler.backend.kernels, block_at=2) as gate:
        call = p.stub.Answer(p.answer_request(tenant, max_new_tokens=N), timeout=CALL_TIMEOUT_S)
        first = await call.read()
        assert await gate.wait_reached()
        stopping = p.begin_stop()
        assert await wait_until(lambda: not_serving(p))
        refused = await rpc_error(lambda: p.answer(tenant, max_new_tokens=2))  # no new calls meanwhile
        assert refused.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert not stopping.done()  # it waits for the stream
        gate.release()
        rest = await collect(call)
    await asyncio.wait_for(stopping, STOP_TIMEOUT_S)
    rest.deltas.insert(0, first.delta)
    assert_greedy(p, rest)
    assert rest.final is not None and rest.final.stats.finish_reason == "length"
    # Its feedback event was applied before the bus stopped.
    assert [s.outputs for s in p.pipeline.draftcache.stats(tenant)] == [1]
    assert p.pipeline.retriever.stats(tenant).sessions == 1
