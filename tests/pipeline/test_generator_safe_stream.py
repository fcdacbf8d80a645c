"""The side-channel-safe stream on the real model over gRPC and HTTP, and the observer it must defeat.

Functional cases: the tokens and text are exactly the normal stream's (decoding is unchanged: the
safe stream re-cuts the engine's stream), every delta has one serialized size and holds
``safe_stream_chunk_tokens`` tokens (the last fewer), deltas keep the cadence, the final stats say only
that the answer is complete, the per-tenant setting turns it on, and the HTTP endpoint passes it on.

The observer the mode must defeat: tests/pipeline/test_generator_observer.py.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from typing import Any

import grpc
import pytest

from lookahead_rag.v1 import events_pb2, generator_pb2
from tests.http.helpers import TENANT_HEADER, ask, raw_client
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    Answered,
    RunningPipeline,
    greedy,
    module_loop,
    module_pipeline,
    params,
    unique_tenant,
)

INTERVAL_MS = 150.0  # the functional cases' cadence
CHUNK = 4  # safe_stream_chunk_tokens
N = 16  # max_new_tokens of the functional cases
EPS_S = 0.01  # timers may fire up to the loop's clock resolution early
ALWAYS_SAFE = unique_tenant("always-safe")
SAFE = {"safe_stream": True}

pipe = module_pipeline(generator={"safe_stream_interval_ms": INTERVAL_MS, "safe_stream_chunk_tokens": CHUNK,
                                  "safe_stream_tenants": [ALWAYS_SAFE]})


async def timed_answer(p: RunningPipeline, request: generator_pb2.AnswerRequest) -> tuple[Answered, list[float]]:
    """The answer and each delta's arrival (seconds after the call was made)."""
    got, arrivals = Answered(), []
    start = time.perf_counter()
    async for chunk in p.stub.Answer(request, timeout=CALL_TIMEOUT_S):
        if chunk.HasField("final"):
            got.final = chunk.final
        else:
            got.deltas.append(chunk.delta)
            arrivals.append(time.perf_counter() - start)
    return got, arrivals


def assert_safe_shape(got: Answered, new_tokens: int) -> None:
    """One serialized size for every delta; CHUNK ids each, the last fewer; the final says only 'complete'."""
    assert got.final is not None
    assert len({generator_pb2.AnswerChunk(delta=d).ByteSize() for d in got.deltas}) == 1
    assert all(d.padding for d in got.deltas)
    counts = [len(d.token_ids) for d in got.deltas if d.token_ids]
    assert all(c == CHUNK for c in counts[:-1]) and 0 < counts[-1] <= CHUNK, counts
    assert got.final.stats == events_pb2.GenerationStats(new_tokens=new_tokens,
                                                         finish_reason=got.final.stats.finish_reason)
    assert got.final.stats.finish_reason in ("length", "eos", "stop")
    assert not (got.final.answer_text or got.final.prompt_ids or got.final.output_ids or got.final.documents)


@module_loop
async def test_safe_stream_has_the_normal_streams_tokens_and_text(pipe: RunningPipeline) -> None:
    # two tenants with the same documents: the same prompt, one answer streamed each way
    normal = await pipe.answer(pipe.new_tenant("normal"), max_new_tokens=N)
    safe, _ = await timed_answer(pipe, pipe.answer_request(pipe.new_tenant("safe"), max_new_tokens=N, **SAFE))
    assert normal.final is not None and safe.final is not None
    assert safe.streamed_ids == normal.streamed_ids == list(normal.final.output_ids)
    assert safe.streamed_ids == greedy(pipe.model, normal.final.prompt_ids, N)
    assert safe.text == normal.text == normal.final.answer_text
    assert_safe_shape(safe, len(normal.streamed_ids))


GENERATE_CASES: dict[str, dict[str, Any]] = {
    # multi-byte characters: the chunk's text is its tokens' whole characters, none broken
    "accents and emoji": {"prompt": "Écris une phrase en français avec des accents et un emoji 😀 : ",
                          "params": {"max_new_tokens": 24}},
    "japanese": {"prompt": "日本語で自己紹介してください。", "params": {"max_new_tokens": 24}},
    # a stop string: the text is cut where the normal stream cuts it
    "stop string": {"prompt": "Count: one, two, three, four, five,", "params": {"max_new_tokens": 24, "stop": [","]}},
}


@module_loop
@pytest.mark.parametrize("case", list(GENERATE_CASES))
async def test_safe_generate_matches_the_normal_stream(pipe: RunningPipeline, case: str) -> None:
    fields = dict(GENERATE_CASES[case])
    gen = fields.pop("params")
    tenant = unique_tenant(case)
    normal = await pipe.generate(generator_pb2.GenerateRequest(tenant=tenant, params=params(**gen), **fields))
    safe = await pipe.generate(generator_pb2.GenerateRequest(tenant=tenant, params=params(**gen, **SAFE), **fields))
    assert normal.final is not None and safe.final is not None
    assert safe.streamed_ids == normal.streamed_ids
    assert safe.text == normal.text == normal.final.answer_text
    assert "\ufffd" not in safe.text or "\ufffd" in normal.text  # no character broken by the re-cut
    assert safe.final.stats.finish_reason == normal.final.stats.finish_reason
    assert_safe_shape(safe, normal.final.stats.new_tokens)


@module_loop
async def test_safe_deltas_keep_the_cadence(pipe: RunningPipeline) -> None:
    # one delta per tick at most: never before its tick, never two in one tick
    interval = INTERVAL_MS / 1000
    tenant = pipe.new_tenant("cadence")
    await pipe.answer(tenant, max_new_tokens=N)
    await pipe.drain()  # the repeat is a cache hit: all tokens verified at once, the cadence still holds
    got, arrivals = await timed_answer(pipe, pipe.answer_request(tenant, max_new_tokens=N, **SAFE))
    assert len(arrivals) == math.ceil(len(got.streamed_ids) / CHUNK)
    assert arrivals[0] >= interval - EPS_S
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(g >= interval - EPS_S for g in gaps)
    assert statistics.median(gaps) < 2 * interval  # once verified, chunks leave tick after tick, not later
    assert_safe_shape(got, len(got.streamed_ids))


@module_loop
async def test_tenant_setting_makes_every_stream_safe(pipe: RunningPipeline) -> None:
    pipe.ingest(ALWAYS_SAFE)
    got = await pipe.answer(ALWAYS_SAFE, max_new_tokens=N)  # the request does not ask for it
    assert_safe_shape(got, len(got.streamed_ids))
    other = await pipe.answer(pipe.new_tenant("not-listed"), max_new_tokens=N)
    assert other.final is not None and not any(d.padding for d in other.deltas)  # off by default
    assert other.final.stats.forward_steps > 0


@module_loop
async def test_cancelled_safe_stream_frees_the_engine(pipe: RunningPipeline) -> None:
    call = pipe.stub.Answer(pipe.answer_request(pipe.new_tenant("cancel"), max_new_tokens=64, **SAFE),
                            timeout=CALL_TIMEOUT_S)
    assert (await call.read()).HasField("delta")
    call.cancel()
    assert await pipe.wait_idle() == 0
    assert await call.code() == grpc.StatusCode.CANCELLED


def sse_events(body: bytes) -> list[bytes]:
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    return events[:-2]


@module_loop
async def test_http_safe_stream_events_have_one_size(pipe: RunningPipeline) -> None:
    tenant = pipe.new_tenant("http-safe")
    normal = await pipe.answer(tenant, max_new_tokens=N)
    assert normal.final is not None
    body = {"messages": ask("How do I pretty-print JSON with json.dumps?"), "max_tokens": N, "safe_stream": True}
    headers = {TENANT_HEADER: pipe.new_tenant("http-safe-2")}  # the same prompt as ``normal``'s
    async with raw_client(pipe) as http:
        streamed = await http.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
        whole = await http.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: pipe.new_tenant("h3")})
    assert streamed.status_code == 200 and whole.status_code == 200, (streamed.text, whole.text)
    events = sse_events(streamed.content)
    objects = [json.loads(e.removeprefix(b"data: ")) for e in events]
    deltas = [(e, o) for e, o in zip(events, objects, strict=True) if o["choices"][0]["finish_reason"] is None]
    assert len(deltas) == math.ceil(normal.final.stats.new_tokens / CHUNK)
    assert len({len(e) for e, _ in deltas}) == 1  # every delta event has one size, padded
    assert "".join(o["choices"][0]["delta"]["content"] for _, o in deltas) == normal.final.answer_text
    assert whole.json()["choices"][0]["message"]["content"] == normal.final.answer_text  # not streamed: whole
