"""Issue 32 item 2: for a tenant in ``[generator] safe_stream_tenants`` every streamed door takes the
side-channel-safe path, or refuses the request with a one-line reason.

The padded stream was only on chat with ``n = 1``: ``/v1/completions`` and chat with ``n = 2`` sent as
many event sizes as the chunks' texts had lengths. Here each door streams a safe tenant's answer and
every delta event (every event carrying a choice that is not its last) must have one size: chat with
n = 1, completions (n = 1), gRPC Answer and Generate; chat and completions with n = 2 are refused
(a safe stream serves one choice).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lookahead_rag.v1 import generator_pb2
from tests.http.helpers import TENANT_HEADER, ask, model, raw_client
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    QUESTION,
    RunningPipeline,
    collect,
    module_loop,
    module_pipeline,
    params,
    unique_tenant,
)

pytestmark = module_loop

SAFE = unique_tenant("safe-doors")
INTERVAL_MS = 10.0  # the cadence: fast, nothing here is about timing
MAX_TOKENS = 24  # six safe chunks of 4 tokens: enough deltas for sizes to differ
PROMPT = "The three primary colours are"

pipe = module_pipeline(generator={"safe_stream_tenants": [SAFE], "safe_stream_interval_ms": INTERVAL_MS})

DOORS: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (path, body without the model)
    "chat": ("/v1/chat/completions", {"messages": ask(QUESTION)}),
    "chat-no-rag": ("/v1/chat/completions", {"messages": ask(QUESTION), "rag": False}),
    "completions": ("/v1/completions", {"prompt": PROMPT}),
    "completions-ids": ("/v1/completions", {"prompt": PROMPT, "return_token_ids": True}),
}
MANY = {  # several choices: refused for a safe tenant
    "chat-n2": ("/v1/chat/completions", {"messages": ask(QUESTION), "n": 2, "temperature": 1.0}),
    "completions-n2": ("/v1/completions", {"prompt": PROMPT, "n": 2, "temperature": 1.0}),
}


async def sse_events(p: RunningPipeline, path: str, body: dict[str, Any]) -> tuple[int, list[bytes]]:
    """(status, every ``data:`` event as sent, separator included) of a streamed request of the safe tenant."""
    async with raw_client(p) as http:
        body = {"model": model(p), "stream": True, "max_tokens": MAX_TOKENS, **body}
        async with http.stream("POST", path, json=body, headers={TENANT_HEADER: SAFE}) as response:
            raw = b"".join([piece async for piece in response.aiter_bytes()])
    return response.status_code, [event + b"\n\n" for event in raw.split(b"\n\n") if event]


def delta_sizes(events: list[bytes]) -> list[int]:
    """The sizes of the events that carry a step of a choice (not its last event, not usage, not [DONE])."""
    sizes = []
    for event in events:
        payload = event.removeprefix(b"data: ").strip()
        if payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        assert "error" not in obj, obj
        if obj.get("choices") and all(c.get("finish_reason") is None for c in obj["choices"]):
            sizes.append(len(event))
    return sizes


@pytest.fixture(scope="module")
def ingested(pipe: RunningPipeline) -> str:
    pipe.ingest(SAFE)
    return SAFE


@pytest.mark.parametrize("door", sorted(DOORS))
async def test_every_http_door_sends_one_delta_event_size(pipe: RunningPipeline, ingested: str, door: str) -> None:
    status, events = await sse_events(pipe, *DOORS[door])
    assert status == 200, events
    sizes = delta_sizes(events)
    assert len(sizes) >= 2 and len(set(sizes)) == 1, f"{door}: delta event sizes {sorted(set(sizes))}"


@pytest.mark.parametrize("door", sorted(MANY))
async def test_several_choices_are_refused_with_one_line(pipe: RunningPipeline, ingested: str, door: str) -> None:
    status, events = await sse_events(pipe, *MANY[door])
    error = json.loads(b"".join(events))["error"]
    assert status == 400 and error["param"] == "n" and "\n" not in error["message"], (status, error)


async def test_grpc_answer_and_generate_send_one_delta_size(pipe: RunningPipeline, ingested: str) -> None:
    answer = generator_pb2.AnswerRequest(tenant=SAFE, question=QUESTION, params=params(max_new_tokens=MAX_TOKENS))
    generate = generator_pb2.GenerateRequest(tenant=SAFE, prompt=PROMPT, params=params(max_new_tokens=MAX_TOKENS))
    for got in (await collect(pipe.stub.Answer(answer, timeout=CALL_TIMEOUT_S)),
                await collect(pipe.stub.Generate(generate, timeout=CALL_TIMEOUT_S))):
        sizes = {generator_pb2.AnswerChunk(delta=d).ByteSize() for d in got.deltas}
        assert len(got.deltas) >= 2 and len(sizes) == 1, sorted(sizes)
