"""Issue 32 item 1: a body of empty messages must not freeze every tenant.

``messages`` had a character limit only, and the chat template was rendered and tokenized on the event
loop, once per choice: 120,000 ``{"role": "user"}`` messages with ``n=16`` (1.9 MB, under the body
cap) held the loop for tens of seconds, and every other tenant's stream with it. Now the messages
are counted first (``[limits] max_messages``, one limit for gRPC and HTTP, and ``max_choice_messages``
for n x messages), their tokens are estimated from below before any render, and the render runs on
a worker thread. The only timing here is an isolation bound: the refusal comes well within
``REFUSED_WITHIN_S`` (the old code took ~50 s), and the other tenant's longest gap between two
events grows by less than ``GAP_MARGIN_S`` over its longest gap alone (the old code: seconds).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any
from unittest import mock

import grpc
import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.generator.domain import ChatMessage
from lookahead_rag.v1 import generator_pb2
from tests.http.helpers import TENANT_HEADER, ask, model, openai_client, raw_client
from tests.pipeline.helpers import CALL_TIMEOUT_S, QUESTION, RunningPipeline, module_loop, module_pipeline, params

pytestmark = module_loop

EMPTY_MESSAGES = 120_000  # the reproduced body: 1.9 MB of {"role": "user"}
CHOICES = 16  # n: each choice rendered the messages again
REFUSED_WITHIN_S = 10.0  # generous isolation bound on 2 shared cores (the old code: ~50 s)
GAP_MARGIN_S = 1.0  # the victim's longest gap may grow by this much while the body is refused (old: seconds)
VICTIM_TOKENS = 48  # the victim's answer: still streaming when the hostile body arrives
HOSTILE_ANSWER_TOKENS = 4

pipe = module_pipeline()


def hostile_body(p: RunningPipeline, rag: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user"}] * EMPTY_MESSAGES
    if rag:  # a question after 120,000 empty turns of history
        messages = [*messages[:-1], {"role": "user", "content": QUESTION}]
    return {"model": model(p), "messages": messages, "n": CHOICES, "temperature": 1.0, "rag": rag,
            "max_tokens": HOSTILE_ANSWER_TOKENS}


async def refused(p: RunningPipeline, tenant: str, rag: bool) -> tuple[float, int, dict[str, Any]]:
    """(seconds until the answer, its status, its error body) of the hostile body."""
    async with raw_client(p) as http:
        start = time.monotonic()
        response = await http.post("/v1/chat/completions", json=hostile_body(p, rag), headers={TENANT_HEADER: tenant})
        return time.monotonic() - start, response.status_code, response.json()["error"]


async def victim_gaps(p: RunningPipeline, tenant: str, started: asyncio.Event | None = None) -> list[float]:
    """The gaps between the events of a plain streamed answer (``started`` set at its first event)."""
    async with openai_client(p, tenant) as client:
        stream = await client.chat.completions.create(model=model(p), messages=ask(QUESTION), stream=True,
                                                      max_tokens=VICTIM_TOKENS)
        times = []
        async for _ in stream:
            times.append(time.monotonic())
            if started is not None:
                started.set()
    return [b - a for a, b in itertools.pairwise(times[1:])]  # after the first content event


@pytest.mark.parametrize("rag", [False, True], ids=["generate", "rag"])
async def test_a_body_of_empty_messages_is_refused_at_once_and_stalls_no_one(pipe: RunningPipeline,
                                                                           rag: bool) -> None:
    evil, victim = pipe.new_tenant("evil"), pipe.new_tenant("victim")
    alone = await victim_gaps(pipe, victim)
    started = asyncio.Event()
    beside = asyncio.create_task(victim_gaps(pipe, victim, started))
    await asyncio.wait_for(started.wait(), CALL_TIMEOUT_S)
    took, status, error = await refused(pipe, evil, rag)
    gaps = await beside
    assert status == 400 and error["param"] == "messages" and "\n" not in error["message"], error
    assert took < REFUSED_WITHIN_S, f"refused after {took:.1f} s"
    assert max(gaps) < max(alone) + GAP_MARGIN_S, f"victim's longest gap {max(gaps):.2f} s (alone {max(alone):.2f} s)"


async def test_grpc_refuses_too_many_messages_and_history_turns_by_the_limit(pipe: RunningPipeline) -> None:
    tenant, limit = pipe.new_tenant("grpc-many"), RequestLimits().max_messages
    empty = [generator_pb2.ChatMessage(role="user") for _ in range(EMPTY_MESSAGES)]
    generate = generator_pb2.GenerateRequest(tenant=tenant, messages=generator_pb2.ChatMessages(messages=empty),
                                             params=params(max_new_tokens=HOSTILE_ANSWER_TOKENS))
    answer = generator_pb2.AnswerRequest(tenant=tenant, question=QUESTION, history=empty,
                                         params=params(max_new_tokens=HOSTILE_ANSWER_TOKENS))
    for call in (pipe.stub.Generate(generate, timeout=CALL_TIMEOUT_S),
                 pipe.stub.Answer(answer, timeout=CALL_TIMEOUT_S)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"the limit is {limit}" in (err.value.details() or ""), err.value.details()


async def test_a_conversation_that_cannot_fit_is_refused_before_it_is_rendered(pipe: RunningPipeline) -> None:
    from lookahead_rag.services.generator.render import PromptRenderer  # the module the fix adds

    context = 8192
    renderer = PromptRenderer(pipe.tokenizer, len(pipe.tokenizer), RequestLimits(max_messages=EMPTY_MESSAGES), context)
    assert renderer.message_tokens >= 1
    too_many = tuple(ChatMessage("user", "") for _ in range(context // renderer.message_tokens + 1))
    with (mock.patch.object(pipe.tokenizer, "apply_chat_template", side_effect=AssertionError("rendered")),
          pytest.raises(InvalidArgument, match=r"at least \d+ tokens; the model's context is 8192")):
        await renderer.ids(too_many)
