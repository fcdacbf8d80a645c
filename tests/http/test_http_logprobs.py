"""logprobs / top_logprobs on /v1/chat/completions (OpenAI's shape, JSON and SSE) equal plain decoding's;
n > 1 on chat; the error body's ``param``. One pipeline for the module (the real model); each test its own tenant.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.http.helpers import ask, bad_request_body, extra, model, openai_client, raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, module_pipeline

pytestmark = module_loop

N = 12  # max_tokens of the answers here
TOP = 3  # top_logprobs asked
TOL = 1e-3  # logprobs: float32 on the wire and a packed forward against transformers' own
PLAIN = {"rag": False, "return_token_ids": True}  # the messages as they are (no retrieval), ids returned

pipe = module_pipeline(limits={"default_m": 0})


def plain_logprobs(p: RunningPipeline, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of plain decoding's logits at each of ``tokens``' positions (one forward of prompt + tokens:
    what transformers' greedy decoding computes step by step) [len(tokens), vocab]."""
    net = p.generator.scheduler.model
    with torch.inference_mode():
        logits = net(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1)


async def chat(p: RunningPipeline, tenant: str, **kw: Any) -> Any:
    async with openai_client(p, tenant) as client:
        return await client.chat.completions.create(model=model(p), messages=ask(QUESTION), max_tokens=N,
                                                    extra_body=PLAIN, **kw)


async def test_chat_logprobs_equal_plain_decoding(pipe: RunningPipeline, tenant: str) -> None:
    got = await chat(pipe, tenant, logprobs=True, top_logprobs=TOP)
    (choice,) = got.choices
    ids, prompt = extra(choice, "token_ids"), extra(got, "prompt_token_ids")
    content = choice.logprobs.content
    # one entry per generated token, its text that token's
    assert len(content) == len(ids) == got.usage.completion_tokens
    tok = pipe.generator.tokenizer
    assert [c.token for c in content] == [tok.decode([t]) for t in ids]
    assert b"".join(bytes(c.bytes) for c in content).decode() == tok.decode(ids)
    want = plain_logprobs(pipe, prompt, ids)
    for i, c in enumerate(content):
        # the chosen token's logprob and the top-3 of plain decoding's distribution at its position
        assert abs(c.logprob - want[i, ids[i]].item()) < TOL
        values, top_ids = want[i].topk(TOP)
        assert [t.token for t in c.top_logprobs] == [tok.decode([t]) for t in top_ids.tolist()]
        assert all(abs(t.logprob - v) < TOL for t, v in zip(c.top_logprobs, values.tolist(), strict=True))
        # greedy: the token chosen is the most likely one
        assert c.token == c.top_logprobs[0].token


async def test_streamed_logprobs_are_the_json_ones(pipe: RunningPipeline, tenant: str) -> None:
    whole = await chat(pipe, tenant, logprobs=True, top_logprobs=TOP)
    async with openai_client(pipe, tenant) as client:
        stream = await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=N,
                                                      stream=True, logprobs=True, top_logprobs=TOP, extra_body=PLAIN)
        chunks = [c async for c in stream]
    streamed = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    # the SSE chunks carry, in order, every token's logprob the JSON answer has
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == \
        [(e.token, round(e.logprob, 4)) for e in whole.choices[0].logprobs.content]
    assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices) == whole.choices[0].message.content


async def test_logprobs_without_top(pipe: RunningPipeline, tenant: str) -> None:
    got = await chat(pipe, tenant, logprobs=True)
    # logprobs alone: each token's own, no alternatives
    assert all(c.top_logprobs == [] for c in got.choices[0].logprobs.content)
    assert len(got.choices[0].logprobs.content) == got.usage.completion_tokens


async def test_n_choices_with_sampling(pipe: RunningPipeline, tenant: str) -> None:
    kw = {"n": 3, "temperature": 1.0, "seed": 7}
    got = await chat(pipe, tenant, **kw)
    # three choices, indexed 0..2, each its own seed: not all the same text
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert len({c.message.content for c in got.choices}) > 1
    assert got.usage.completion_tokens == sum(len(extra(c, "token_ids")) for c in got.choices)
    # the same request gives the same choices; choice 0 is the request's seed alone (n=1)
    again = await chat(pipe, tenant, **kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in got.choices]
    one = await chat(pipe, tenant, temperature=1.0, seed=7)
    assert one.choices[0].message.content == got.choices[0].message.content


async def test_n_choices_stream_interleaved_by_index(pipe: RunningPipeline, tenant: str) -> None:
    whole = await chat(pipe, tenant, n=2, temperature=1.0, seed=11)
    async with openai_client(pipe, tenant) as client:
        stream = await client.chat.completions.create(
            model=model(pipe), messages=ask(QUESTION), max_tokens=N, stream=True, n=2, temperature=1.0, seed=11,
            stream_options={"include_usage": True}, extra_body=PLAIN)
        chunks = [c async for c in stream]
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    # each index's deltas concatenate to that choice's JSON text; both finish; usage sums them once at the end
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert set(finishes) == {0, 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


# case -> (create() arguments, the param named)
PARAMS: dict[str, tuple[dict[str, Any], str]] = {
    "top_logprobs over 20": ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # OpenAI's bound
    "top_logprobs without logprobs": ({"top_logprobs": 2}, "top_logprobs"),
    "greedy n": ({"n": 2}, "n"),  # n > 1 needs sampling
    "top_p over 1": ({"temperature": 0.5, "top_p": 1.5}, "top_p"),  # the engine's check, its field named
}


@pytest.mark.parametrize("case", list(PARAMS))
async def test_error_body_names_the_param(pipe: RunningPipeline, tenant: str, case: str) -> None:
    fields, param = PARAMS[case]
    body = await bad_request_body(chat(pipe, tenant, **fields))
    # the field named, the code as for every invalid argument
    assert body["param"] == param and body["code"] == "invalid_argument", body


async def test_error_body_has_param_null_when_unknown_and_the_field_of_a_bad_type(
        pipe: RunningPipeline, tenant: str) -> None:
    async with raw_client(pipe) as http:
        unknown = await http.post("/v1/chat/completions", json={"messages": ask(QUESTION)},
                                  headers={"x-tenant": tenant, "x-request-timeout": "-1"})
        typed = await http.post("/v1/chat/completions", json={"messages": ask(QUESTION), "max_tokens": "ten"},
                                headers={"x-tenant": tenant})
    # every error body has the param key: null when no field is at fault, the field when one is
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] is None, unknown.text
    assert typed.status_code == 400 and typed.json()["error"]["param"] == "max_tokens", typed.text
