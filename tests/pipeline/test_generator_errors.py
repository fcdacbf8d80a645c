"""Generator bad input, overload, queueing, cancel and deadlines over real gRPC (loopback, port 0).

Every refused request gets its exact status code and a one-line message. Holding a request in
flight, cancelling at a known step and running out a deadline are made deterministic by gating
the engine's batched forward (``ForwardGate``) instead of relying on timing; ``SubmitSpy`` gives
the test the engine's own request objects (cancelled flag, phase, output).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from lookahead_rag.v1 import generator_pb2
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    Answered,
    RunningPipeline,
    assert_status,
    collect,
    greedy,
    module_loop,
    module_pipeline,
    params,
    pipeline_settings,
    rpc_error,
    unique_tenant,
    wait_until,
)
from tests.pipeline.spies import ForwardGate, SubmitSpy, TimeoutRecorder, ended, held_answer

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MAX_QUESTION = 1500
MAX_K = 5
MAX_NEW = 64  # [limits] max_new_tokens
CONTEXT = 512  # the retriever's prompt context (max_context_tokens): prompt budget = CONTEXT - max_new
SMALL_MESSAGE_BYTES = 64 * 1024
DEADLINE_S = 5.0
REFUSAL_TIMEOUT_S = 60.0  # a refused call must not wait for the held one (gated for GATE_TIMEOUT_S)


pipe = module_pipeline(limits={"max_question_chars": MAX_QUESTION, "max_k": MAX_K, "max_new_tokens": MAX_NEW,
                               "default_max_new_tokens": MAX_NEW // 2},
                       retriever={"max_context_tokens": CONTEXT})
# one request at a time, no waiting queue, and small gRPC messages
limited = module_pipeline(generator={"max_running": 1, "max_waiting": 0, "max_message_bytes": SMALL_MESSAGE_BYTES})
queued = module_pipeline(generator={"max_running": 1, "max_waiting": 2})  # one running, two more may wait


def answer_call(p: RunningPipeline, **fields: Any) -> Callable[[], Awaitable[Answered]]:
    gen = fields.pop("params", {})
    request = generator_pb2.AnswerRequest(**{"tenant": "acme", "question": "What is csv?", **fields},
                                          params=params(**gen))
    return lambda: collect(p.stub.Answer(request, timeout=CALL_TIMEOUT_S))


def generate_call(p: RunningPipeline, **fields: Any) -> Callable[[], Awaitable[Answered]]:
    gen = fields.pop("params", {"max_new_tokens": 4})
    request = generator_pb2.GenerateRequest(**{"tenant": "acme", **fields}, params=params(**gen))
    return lambda: collect(p.stub.Generate(request, timeout=CALL_TIMEOUT_S))


def digits(n: int) -> str:
    """``n`` digits separated by spaces: about 2n tokens (each digit and space is one)."""
    return " ".join(str(i % 10) for i in range(n))


ANSWER_REFUSALS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "empty question": ({"question": ""}, ("question is empty",)),
    "blank question": ({"question": " \n\t "}, ("question is empty",)),
    "question over the limit": ({"question": "x" * (MAX_QUESTION + 1)}, (f"limit is {MAX_QUESTION}",)),
    "max_new_tokens over the limit": ({"params": {"max_new_tokens": MAX_NEW + 1}}, ("max_new_tokens",)),
    "unknown mode": ({"params": {"mode": "beam"}}, ("unknown mode", "beam")),
    "k over max_k": ({"k": MAX_K + 1}, (f"k={MAX_K + 1}",)),
    "m over the retriever's max_m": ({"m": 1000}, ("m=1000",)),
    "empty tenant": ({"tenant": ""}, ("tenant is empty",)),
    "blank tenant": ({"tenant": "   "}, ("tenant is empty",)),
    "tenant over the limit": ({"tenant": "t" * 129}, ("tenant",)),
    "decoding_length over the limit": ({"params": {"decoding_length": 1000}}, ("decoding_length",)),
    "branch_length too short": ({"params": {"branch_length": 1}}, ("branch_length",)),
    "branch_length too long": ({"params": {"branch_length": 1000}}, ("branch_length",)),
    "empty stop string": ({"params": {"stop": ["\n", ""]}}, ("empty stop string",)),
    "too many stop strings": ({"params": {"stop": [f"s{i}" for i in range(9)]}}, ("stop strings",)),
    # sampling: refused before any retrieval, NaN included (it compares false with every bound)
    "negative temperature": ({"params": {"temperature": -0.5}}, ("temperature", ">= 0")),
    "NaN temperature": ({"params": {"temperature": float("nan")}}, ("temperature",)),
    "infinite temperature": ({"params": {"temperature": float("inf")}}, ("temperature", "finite")),
    "top_p over 1": ({"params": {"temperature": 0.7, "top_p": 1.5}}, ("top_p", "(0, 1]")),
    "negative top_p": ({"params": {"temperature": 0.7, "top_p": -0.1}}, ("top_p",)),
    "min_p over 1": ({"params": {"temperature": 0.7, "min_p": 1.5}}, ("min_p", "[0, 1]")),
    "negative min_p": ({"params": {"temperature": 0.7, "min_p": -0.5}}, ("min_p",)),
    "negative repetition_penalty": ({"params": {"repetition_penalty": -1.0}}, ("repetition_penalty", "> 0")),
    "NaN repetition_penalty": ({"params": {"repetition_penalty": float("nan")}}, ("repetition_penalty",)),
    # ~1000 question tokens do not fit CONTEXT - max_new_tokens: refused by the retriever's budget
    "prompt cannot fit with max_new_tokens": (
        {"question": digits(MAX_QUESTION // 2 - 1), "params": {"max_new_tokens": MAX_NEW}},
        ("max_new_tokens", "shorten the question"),
    ),
}


@module_loop
@pytest.mark.parametrize("case", list(ANSWER_REFUSALS))
async def test_answer_bad_input_is_invalid_argument(pipe: RunningPipeline, case: str) -> None:
    fields, words = ANSWER_REFUSALS[case]
    assert_status(await rpc_error(answer_call(pipe, **fields)), INVALID, *words)
    assert pipe.inflight == 0


Msgs = generator_pb2.ChatMessages
Ids = generator_pb2.TokenIds
# Each case is made from the running engine ``e``: some depend on its vocabulary, window or limits.
GENERATE_REFUSALS: dict[str, Callable[[Any], tuple[dict[str, Any], tuple[str, ...]]]] = {
    "neither prompt nor messages": lambda e: ({}, ("prompt", "chat messages", "prompt_ids")),
    "empty prompt": lambda e: ({"prompt": ""}, ("prompt is empty",)),
    "empty messages": lambda e: ({"messages": Msgs()}, ("messages is empty",)),
    "unknown role": lambda e: ({"messages": Msgs(messages=[generator_pb2.ChatMessage(role="tool", content="x")])},
                               ("role",)),
    "empty prompt_ids": lambda e: ({"prompt_ids": Ids()}, ("prompt_ids is empty",)),
    "prompt id == tokenizer size": lambda e: ({"prompt_ids": Ids(ids=[5, e.tokenizer_size])},
                                              ("prompt token id", str(e.tokenizer_size), "vocabulary")),
    "prompt id 2**32-1": lambda e: ({"prompt_ids": Ids(ids=[5, 2**32 - 1])}, ("prompt token id", "vocabulary")),
    "prompt_ids over max_prompt_chars": lambda e: ({"prompt_ids": Ids(ids=[5] * (e.limits.max_prompt_chars + 1))},
                                                   ("prompt_ids", f"limit is {e.limits.max_prompt_chars}")),
    "prompt_ids cannot fit the context": lambda e: ({"prompt_ids": Ids(ids=[5] * e.context_tokens)},
                                                    ("does not fit", str(e.context_tokens))),
    "reference id == vocab size": lambda e: ({"prompt": "Hi", "reference_ids": [5, e.vocab_size]},
                                             (str(e.vocab_size), "vocabulary")),
    "reference id 2**32-1": lambda e: ({"prompt": "Hi", "reference_ids": [2**32 - 1]}, ("vocabulary",)),
    "too many references": lambda e: ({"prompt": "Hi", "references": ["r"] * 17}, ("references",)),
    "prompt over max_prompt_chars": lambda e: ({"prompt": "a " * (e.limits.max_prompt_chars // 2 + 1)},
                                               (f"limit is {e.limits.max_prompt_chars}",)),
    # context_tokens: the model's window (8192 for SmolLM2)
    "prompt cannot fit the context": lambda e: ({"prompt": digits(e.context_tokens), "params": {"max_new_tokens": 16}},
                                                ("does not fit", str(e.context_tokens))),
    "empty tenant": lambda e: ({"tenant": "", "prompt": "Hi"}, ("tenant is empty",)),
    "max_new_tokens over the limit": lambda e: ({"prompt": "Hi", "params": {"max_new_tokens": MAX_NEW + 1}},
                                                ("max_new_tokens",)),
    # sampling: the same checks as Answer (one mapping for both calls)
    "negative temperature": lambda e: ({"prompt": "Hi", "params": {"temperature": -1.0}}, ("temperature",)),
    "NaN top_p": lambda e: ({"prompt": "Hi", "params": {"temperature": 0.7, "top_p": float("nan")}}, ("top_p",)),
    "min_p over 1": lambda e: ({"prompt": "Hi", "params": {"temperature": 0.7, "min_p": 2.0}}, ("min_p",)),
    "negative repetition_penalty": lambda e: ({"prompt": "Hi", "params": {"repetition_penalty": -0.5}},
                                              ("repetition_penalty",)),
}


@module_loop
@pytest.mark.parametrize("case", list(GENERATE_REFUSALS))
async def test_generate_bad_input_is_invalid_argument(pipe: RunningPipeline, case: str) -> None:
    fields, words = GENERATE_REFUSALS[case](pipe.generator)
    assert_status(await rpc_error(generate_call(pipe, **fields)), INVALID, *words)
    assert pipe.inflight == 0


@module_loop
async def test_generate_accepts_the_largest_vocabulary_id(pipe: RunningPipeline) -> None:
    got = await generate_call(pipe, prompt="Hello", reference_ids=[0, pipe.generator.vocab_size - 1],
                              params={"max_new_tokens": 1})()
    assert got.final is not None and got.final.stats.new_tokens == 1


@module_loop
async def test_answer_for_unknown_tenant_is_not_found(pipe: RunningPipeline) -> None:
    unknown = unique_tenant("never-ingested")
    err = await rpc_error(answer_call(pipe, tenant=unknown, params={"max_new_tokens": 2}))
    assert_status(err, grpc.StatusCode.NOT_FOUND, "unknown tenant", unknown)
    assert pipe.inflight == 0


@pytest.mark.parametrize(("section", "limits"), [
    ("limits", {"default_max_new_tokens": MAX_NEW + 1, "max_new_tokens": MAX_NEW}),  # every default refused
    ("generator", {"decoding_length": 9, "max_decoding_length": 8}),
])
def test_settings_refuse_defaults_over_their_limits(tmp_path: Path, section: str, limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(limits))):
        pipeline_settings(tmp_path, **{section: limits})


@module_loop
async def test_cancel_mid_stream_stops_decoding_within_one_step(pipe: RunningPipeline, tenant: str) -> None:
    request = pipe.answer_request(tenant, max_new_tokens=MAX_NEW, mode="none")
    scheduler = pipe.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=3) as gate:
        call = pipe.stub.Answer(request, timeout=CALL_TIMEOUT_S)
        first = await call.read()  # the prefill's token
        assert first.HasField("delta") and len(first.delta.token_ids) == 1
        assert await gate.wait_reached()  # the second step's forward waits at the gate
        (req,) = spy.requests
        call.cancel()
        assert await wait_until(req.cancelled.is_set)  # the server saw it and told the scheduler
        assert not ended(req)  # still in the forward under way
        gate.release()
        assert await wait_until(lambda: ended(req))
        assert await pipe.wait_idle() == 0
        assert gate.calls == 3  # the forward under way finished; no step after the cancel
    assert req.stats.finish_reason == "cancelled" and not scheduler.holds(req)  # its cache went with it
    assert len(req.output) == 3  # the prefill's token and one per finished step (mode none)
    with pytest.raises(asyncio.CancelledError):  # grpc.aio: reading a call the client cancelled
        await call.read()
    assert await call.code() == grpc.StatusCode.CANCELLED
    await pipe.drain()
    assert pipe.events.for_tenant(tenant) == []  # a cancelled answer is not published
    assert pipe.pipeline.draftcache.stats(tenant) == []
    assert pipe.pipeline.retriever.stats(tenant).sessions == 0
    after = await pipe.answer(tenant, max_new_tokens=8)  # the server is fine
    assert after.final is not None and after.final.stats.new_tokens == 8


@module_loop
async def test_deadline_is_honoured_and_passed_downstream(pipe: RunningPipeline, tenant: str) -> None:
    engine = pipe.generator
    retriever, drafts = TimeoutRecorder(engine.retriever), TimeoutRecorder(engine.draft_cache)
    engine.retriever, engine.draft_cache = retriever, drafts
    try:
        with SubmitSpy(engine.scheduler) as spy, ForwardGate(engine.scheduler.backend.kernels, block_at=2) as gate:
            call = pipe.stub.Answer(pipe.answer_request(tenant, max_new_tokens=MAX_NEW), timeout=DEADLINE_S)
            err = await rpc_error(lambda: collect(call))
            assert_status(err, grpc.StatusCode.DEADLINE_EXCEEDED)
            req = spy.last()
            if req is not None:  # decoding had started: it is told to stop
                assert await wait_until(req.cancelled.is_set)
            gate.release()
            assert await pipe.wait_idle() == 0
            assert gate.calls <= 2  # nothing decoded after the deadline
        if req is not None:
            assert ended(req) and req.stats.finish_reason == "cancelled"
            assert len(req.output) <= 2  # the prefill's token and at most the held step's
    finally:
        engine.retriever, engine.draft_cache = retriever.inner, drafts.inner
    configured = engine.settings.retrieve_timeout_s
    assert configured > DEADLINE_S
    assert retriever.timeouts and all(0 < t < DEADLINE_S for t in retriever.timeouts)  # the time left
    assert all(0 < t < DEADLINE_S for t in drafts.timeouts)
    await pipe.drain()
    assert pipe.events.for_tenant(tenant) == []
    after = await pipe.answer(tenant, max_new_tokens=8)
    assert after.final is not None and after.final.stats.new_tokens == 8


@module_loop
async def test_overload_is_refused_at_once(limited: RunningPipeline) -> None:
    tenant = limited.new_tenant("overload")
    n = 8
    async with held_answer(limited, tenant, n):  # the held request is unaffected
        assert limited.inflight == 1
        second = limited.stub.Answer(limited.answer_request(tenant, max_new_tokens=n), timeout=REFUSAL_TIMEOUT_S)
        assert_status(await rpc_error(lambda: collect(second)), EXHAUSTED, "overloaded")
        generate = generator_pb2.GenerateRequest(tenant=tenant, prompt="Hi", params=params(max_new_tokens=2))
        refused = limited.stub.Generate(generate, timeout=REFUSAL_TIMEOUT_S)
        assert_status(await rpc_error(lambda: collect(refused)), EXHAUSTED, "overloaded")
    assert await limited.wait_idle() == 0
    after = await limited.answer(tenant, max_new_tokens=4)  # admission is free again
    assert after.final is not None and after.final.stats.new_tokens == 4


QUEUED_QUESTIONS = ["How do I read the rows of a CSV file?", "What does Path.exists() tell?"]


@module_loop
async def test_requests_past_max_running_wait_their_turn(queued: RunningPipeline) -> None:
    # one request running (held in its step), two more wait instead of being refused and then decode
    # exactly as alone; the one after them, past the queue, is refused at once
    p = queued
    tenant = p.new_tenant("queued")
    scheduler = p.generator.scheduler
    n = 8
    async with held_answer(p, tenant, n) as held:
        waiting = [p.stub.Answer(p.answer_request(tenant, question=q, max_new_tokens=n), timeout=CALL_TIMEOUT_S)
                   for q in QUEUED_QUESTIONS]
        assert await wait_until(lambda: scheduler.state().waiting == len(QUEUED_QUESTIONS))  # queued, not refused
        assert p.inflight == 3 and scheduler.state().running == 1
        over = p.stub.Answer(p.answer_request(tenant, max_new_tokens=n), timeout=REFUSAL_TIMEOUT_S)
        assert_status(await rpc_error(lambda: collect(over)), EXHAUSTED, "overloaded")  # past the queue: at once
        assert scheduler.state().waiting == len(QUEUED_QUESTIONS) and len(held.spy.requests) == 3
    for call in waiting:  # each waited its turn, then decoded exactly as alone
        got = await collect(call)
        assert got.final is not None and got.final.stats.finish_reason == "length"
        assert got.streamed_ids == list(got.final.output_ids) == greedy(p.model, got.final.prompt_ids, n)
    assert all(ended(req) and req.error is None for req in held.spy.requests)
    assert await p.wait_idle() == 0


@module_loop
async def test_oversize_message_is_resource_exhausted(limited: RunningPipeline) -> None:
    prompt = "word " * (SMALL_MESSAGE_BYTES // 4)  # under max_prompt_chars, over max_message_bytes
    assert len(prompt) < limited.generator.limits.max_prompt_chars
    err = await rpc_error(generate_call(limited, tenant="acme", prompt=prompt))
    assert_status(err, EXHAUSTED)
    assert limited.inflight == 0
    small = await generate_call(limited, tenant="acme", prompt="word " * 10, params={"max_new_tokens": 2})()
    assert small.final is not None and small.final.stats.new_tokens == 2
