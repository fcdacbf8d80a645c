"""The serving engine under load and faults, over real gRPC (loopback, port 0) with the real model.

- 64 concurrent Answer streams, 10 of them cancelled after their first chunk: the other 54 equal
  plain greedy decoding of their own prompt, none is refused, requests shared forwards;
- a request waiting in the queue past its deadline gets DEADLINE_EXCEEDED and never runs; past the
  queue a request is refused at once with RESOURCE_EXHAUSTED;
- a repeated identical answer reuses its prompt's KV (prefix cache) and gives the same tokens;
- afterwards the engine is idle: nothing waiting or running, no KV held, the gauges read 0.

Holding requests in flight is made deterministic by gating the engine's batched forward
(``ForwardGate``: the scheduler thread waits, so running requests stay running and newcomers stay
queued). One pipeline per capacity setting for the module; the model is loaded once per process.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import pytest

from lookahead_rag.services.common.errors import DeadlineExceeded
from lookahead_rag.services.generator.convert import generate_query
from lookahead_rag.services.generator.domain import AnswerChunk
from lookahead_rag.v1 import generator_pb2
from tests.pipeline import helpers as calls  # collect a stream, check a status, greedy ids
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    QUESTION,
    Answered,
    RunningPipeline,
    module_loop,
    module_pipeline,
    params,
    rpc_error,
    wait_until,
)
from tests.pipeline.spies import ForwardGate, SubmitSpy, ended, held_answer

N = 8  # max_new_tokens of the answers compared with greedy (small: CI time)
CANCELLED_N = 64  # max_new_tokens of the streams cancelled mid-way: far from done when cancelled
STREAMS = 64
CANCELLED = frozenset(range(2, 62, 6))  # 10 of the 64 streams, spread over the burst
QUESTIONS = [  # distinct prompts (some over prefill_chunk: prefilled in two chunks)
    QUESTION,
    "How do I read the rows of a CSV file?",
    "What does Path.exists() tell?",
    "How do I sort the keys of a dictionary in JSON output?",
]
TENANTS = 2
SHORT_DEADLINE_S = 3.0  # a waiting request's gRPC timeout: long enough to reach the queue, short to wait out
REFUSAL_TIMEOUT_S = 60.0  # a refused call must not wait for the held one (gated for GATE_TIMEOUT_S)
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

pytestmark = module_loop


# the default capacity (16 running, 64 waiting); no past sessions, so a repeat has the same prompt
load = module_pipeline(generator={"max_running": 16, "max_waiting": 64}, limits={"default_m": 0})


small = module_pipeline(generator={"max_running": 1, "max_waiting": 1})  # one running and one waiting at most


class Greedy:
    """Plain greedy decoding of each distinct prompt, computed once."""

    def __init__(self, p: RunningPipeline) -> None:
        self.p = p
        self.done: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def __call__(self, prompt_ids: Sequence[int], n: int = N) -> list[int]:
        key = (tuple(prompt_ids), n)
        if key not in self.done:
            self.done[key] = calls.greedy(self.p.model, prompt_ids, n)
        return self.done[key]


async def assert_idle(p: RunningPipeline) -> None:
    """Nothing waiting or running in the engine, and no KV held."""
    assert await p.wait_idle() == 0
    state = p.generator.scheduler.state()
    assert (state.waiting, state.running, state.kv_bytes) == (0, 0, 0)


def gauge(p: RunningPipeline, name: str) -> float | None:
    return p.pipeline.registry.get_sample_value(f"lookahead_rag_{name}")


def generate_request(tenant: str, prompt: str, n: int) -> generator_pb2.GenerateRequest:
    """A raw-prompt request without drafts: no retrieval, no draft fetch, straight into the queue."""
    return generator_pb2.GenerateRequest(tenant=tenant, prompt=prompt, params=params(max_new_tokens=n, mode="none"))


@dataclass
class Outcome:
    """What one client of the burst saw."""

    index: int
    got: Answered | None = None  # a stream read to its end
    first: generator_pb2.AnswerChunk | None = None  # a cancelled stream's first chunk
    error: grpc.RpcError | None = None
    code: grpc.StatusCode | None = None  # the status the call ended with, as the client sees it


async def run_client(p: RunningPipeline, index: int, request: generator_pb2.AnswerRequest) -> Outcome:
    out = Outcome(index)
    call = p.stub.Answer(request, timeout=CALL_TIMEOUT_S)
    try:
        if index in CANCELLED:
            out.first = await call.read()
            call.cancel()  # the client goes away mid-stream
        else:
            out.got = await calls.collect(call)
    except grpc.RpcError as err:
        out.error = err
    out.code = await call.code()
    return out


async def test_64_concurrent_answers_with_10_cancelled_mid_stream(load: RunningPipeline) -> None:
    # 64 streams at once (more than max_running: the rest queue): the 54 read to the end each equal
    # plain greedy of their own prompt, the 10 cancelled end as cancelled, and none is refused
    p = load
    tenants = [p.new_tenant(f"load-{i}") for i in range(TENANTS)]
    requests = []
    for i in range(STREAMS):
        tenant, question = tenants[i % TENANTS], QUESTIONS[i // TENANTS % len(QUESTIONS)]
        if i in CANCELLED:  # one token per step: many steps from done when the cancel arrives
            requests.append(p.answer_request(tenant, question, max_new_tokens=CANCELLED_N, mode="none"))
        else:
            requests.append(p.answer_request(tenant, question, max_new_tokens=N))
    assert len(CANCELLED) == 10
    with SubmitSpy(p.generator.scheduler) as spy:
        outcomes = await asyncio.gather(*(run_client(p, i, requests[i]) for i in range(STREAMS)))
    await assert_idle(p)

    baseline = Greedy(p)
    finals = []
    for out in outcomes:
        if out.index in CANCELLED:
            assert out.first is not None and out.first.HasField("delta"), out  # it was streaming
            assert out.code == grpc.StatusCode.CANCELLED, out
            continue
        assert out.error is None and out.code == grpc.StatusCode.OK, (out.index, out.error)  # nothing refused or failed
        assert out.got is not None and out.got.final is not None
        final = out.got.final
        assert final.stats.finish_reason == "length"
        assert out.got.streamed_ids == list(final.output_ids) == baseline(final.prompt_ids), out.index
        assert out.got.text == final.answer_text
        finals.append(final)
    assert len(finals) == STREAMS - len(CANCELLED)
    assert len(spy.requests) == STREAMS and all(ended(r) for r in spy.requests)
    reasons = Counter(r.stats.finish_reason for r in spy.requests)
    assert reasons == {"length": STREAMS - len(CANCELLED), "cancelled": len(CANCELLED)}
    assert all(len(r.output) < CANCELLED_N for r in spy.requests if r.stats.finish_reason == "cancelled")
    assert max(f.stats.max_batch_size for f in finals) > 1  # requests shared forwards
    assert all(1 <= f.stats.max_batch_size <= 16 for f in finals)  # never more than max_running at once
    published = [e for t in tenants for e in p.events.for_tenant(t)]
    assert len(published) == len(finals)  # every finished answer, and no cancelled one


async def test_waiting_request_past_its_deadline_and_request_past_the_queue(small: RunningPipeline) -> None:
    # one request runs (held in its step), one waits: a waiting request whose deadline passes gets
    # DEADLINE_EXCEEDED, never runs and frees its place at once; with the queue full the next request
    # is refused at once; the held and the queued requests then finish equal to greedy
    p = small
    tenant = p.new_tenant("queue")
    scheduler = p.generator.scheduler
    async with held_answer(p, tenant, N) as held:  # the one running place is taken
        spy = held.spy
        late = p.stub.Generate(generate_request(tenant, "Count to five:", N), timeout=SHORT_DEADLINE_S)
        assert await wait_until(lambda: len(spy.requests) == 2)  # it reached the queue
        late_req = spy.requests[1]
        assert scheduler.state().waiting == 1
        calls.assert_status(await rpc_error(lambda: calls.collect(late)), grpc.StatusCode.DEADLINE_EXCEEDED)
        assert await wait_until(lambda: ended(late_req) and scheduler.state().waiting == 0)  # freed while still held
        assert late_req.output == [] and late_req.stats.forward_steps == 0 and not scheduler.holds(late_req)

        queued = p.stub.Generate(generate_request(tenant, "Name three colours:", N), timeout=CALL_TIMEOUT_S)
        assert await wait_until(lambda: scheduler.state().waiting == 1)
        over = p.stub.Generate(generate_request(tenant, "Name three fruits:", N), timeout=REFUSAL_TIMEOUT_S)
        calls.assert_status(await rpc_error(lambda: calls.collect(over)), EXHAUSTED, "overloaded")
        assert len(spy.requests) == 3 and held.gate.calls == 2  # the refused one never queued; nothing ran meanwhile
    after = await calls.collect(queued)
    assert after.final is not None
    assert after.streamed_ids == list(after.final.output_ids) == calls.greedy(p.model, after.final.prompt_ids, N)
    await assert_idle(p)


async def test_engine_expires_a_waiting_request_whose_deadline_passed(small: RunningPipeline) -> None:
    # without gRPC's own deadline: the engine ends a request whose deadline passes in the queue with
    # DeadlineExceeded before it ever runs, and the request holding the running place is unaffected
    p = small
    tenant = p.new_tenant("expire")
    scheduler = p.generator.scheduler
    async with held_answer(p, tenant, N) as held:  # unaffected
        spy = held.spy
        deadline = time.monotonic() + 1.0

        async def drive() -> list[AnswerChunk]:
            query = generate_query(generate_request(tenant, "Count to five:", N))
            return [c async for c in p.generator.generate(query, deadline)]

        waiting = asyncio.ensure_future(drive())
        assert await wait_until(lambda: len(spy.requests) == 2 and scheduler.state().waiting == 1)
        expired = spy.requests[1]
        assert await wait_until(lambda: time.monotonic() > deadline)
        assert not ended(expired)  # the engine notices between steps (this one is held)
        held.gate.release()
        with pytest.raises(DeadlineExceeded, match="waited"):
            await asyncio.wait_for(waiting, CALL_TIMEOUT_S)
    assert expired.output == [] and expired.stats.forward_steps == 0 and ended(expired)
    await assert_idle(p)


async def test_repeated_answer_reuses_the_prompt_prefix(load: RunningPipeline) -> None:
    # the same question twice for one tenant: the second prefills only its last prompt token (the rest
    # of its KV comes from the prefix cache) and its tokens do not change
    p = load
    tenant = p.new_tenant("prefix")
    counter = "generator_prefix_cache_hit_tokens_total"
    cold = await p.answer(tenant, max_new_tokens=N)
    before = gauge(p, counter) or 0.0
    warm = await p.answer(tenant, max_new_tokens=N)
    assert cold.final is not None and warm.final is not None
    prompt = list(cold.final.prompt_ids)
    assert list(warm.final.prompt_ids) == prompt
    assert cold.final.stats.prefix_hit_tokens == 0  # a new tenant: nothing cached
    assert warm.final.stats.prefix_hit_tokens == len(prompt) - 1  # the last one runs: it gives the first token
    assert (gauge(p, counter) or 0.0) - before == warm.final.stats.prefix_hit_tokens
    assert list(warm.final.output_ids) == list(cold.final.output_ids) == calls.greedy(p.model, prompt, N)
    assert warm.streamed_ids == list(warm.final.output_ids)
    await assert_idle(p)


async def test_gauges_follow_the_queue_and_read_zero_when_idle(load: RunningPipeline) -> None:
    # sampled gauges: one running (held) and one waiting show up after a refresh; after all of this
    # module's load the engine is idle and the gauges read 0
    p = load
    tenant = p.new_tenant("gauges")
    scheduler = p.generator.scheduler
    refresh = p.pipeline.refresh_metrics
    with ForwardGate(scheduler.backend.kernels, block_at=2) as gate:
        held = p.stub.Answer(p.answer_request(tenant, max_new_tokens=N), timeout=CALL_TIMEOUT_S)
        await held.read()
        assert await gate.wait_reached()
        queued = p.stub.Generate(generate_request(tenant, "Name three colours:", N), timeout=CALL_TIMEOUT_S)
        assert await wait_until(lambda: scheduler.state().waiting == 1)  # the scheduler thread is held: it waits
        refresh()
        assert gauge(p, "generator_queue_depth") == 1
        assert gauge(p, "generator_running_requests") == 1
        assert (gauge(p, "generator_kv_bytes") or 0) > 0
        gate.release()
        await calls.collect(held)
        await calls.collect(queued)
    await assert_idle(p)
    refresh()
    assert gauge(p, "generator_queue_depth") == 0
    assert gauge(p, "generator_running_requests") == 0
    assert gauge(p, "generator_kv_bytes") == 0
    assert gauge(p, "generator_tokens_per_forward_count") == scheduler.state().forwards > 0  # one per forward
    assert (gauge(p, "generator_draft_budget_tokens_count") or 0) > 0
