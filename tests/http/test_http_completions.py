"""``POST /v1/completions`` with the real ``openai`` client: text or token-id prompts, JSON and SSE, legacy
logprobs, n choices, and its refusals (one-line 400s naming the param)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.http.helpers import bad_request_body, extra, model, openai_client
from tests.pipeline.helpers import RunningPipeline, module_loop, module_pipeline

pytestmark = module_loop

N = 10  # max_tokens of the completions here
PROMPT = "The three primary colors are"
IDS = {"return_token_ids": True}

pipe = module_pipeline(limits={"default_m": 0})


async def complete(p: RunningPipeline, tenant: str, **kw: Any) -> Any:
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("max_tokens", N)
    async with openai_client(p, tenant) as client:
        return await client.completions.create(model=model(p), extra_body=IDS, **kw)


async def stream(p: RunningPipeline, tenant: str, **kw: Any) -> list[Any]:
    async with openai_client(p, tenant) as client:
        events = await client.completions.create(model=model(p), prompt=PROMPT, max_tokens=N, stream=True,
                                                 stream_options={"include_usage": True}, **kw)
        return [c async for c in events]


async def test_text_and_token_id_prompts_give_the_same_completion(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant)
    (choice,) = got.choices
    assert got.object == "text_completion" and choice.index == 0 and choice.text
    # greedy to max_tokens: the prompt decoded as given (no template), usage counts it
    prompt_ids = extra(got, "prompt_token_ids")
    assert prompt_ids == pipe.generator.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert choice.finish_reason == "length" and got.usage.completion_tokens == N
    assert got.usage.prompt_tokens == len(prompt_ids) and got.usage.total_tokens == len(prompt_ids) + N
    # the same prompt as token ids: the same tokens
    by_ids = await complete(pipe, tenant, prompt=prompt_ids)
    assert by_ids.choices[0].text == choice.text and extra(by_ids.choices[0], "token_ids") == extra(choice, "token_ids")


async def test_stream_concatenates_to_the_completion(pipe: RunningPipeline, tenant: str) -> None:
    whole = await complete(pipe, tenant)
    chunks = await stream(pipe, tenant)
    texts = [ch.text for c in chunks for ch in c.choices]
    # the SSE chunks join to the JSON text; the last with a choice says why it ended; usage comes last
    assert "".join(texts) == whole.choices[0].text
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == N


async def test_legacy_logprobs(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant, logprobs=2)
    lp = got.choices[0].logprobs
    # one entry per token: its text, logprob, top-2 alternatives by text, its offset in the completion's text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == N
    assert "".join(lp.tokens) == got.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(N)]
    assert all(v <= 0 for v in lp.token_logprobs)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2 and abs(max(top.values()) - value) < 1e-5  # greedy: the chosen is the likeliest
        assert top.get(token) == pytest.approx(value, abs=1e-5)
    # streamed: the same logprobs, chunk by chunk, offsets counted across the chunks
    chunks = await stream(pipe, tenant, logprobs=2)
    tokens = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.tokens]
    offsets = [o for c in chunks for ch in c.choices if ch.logprobs for o in ch.logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


async def test_n_choices_with_sampling(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant, n=3, temperature=1.0, seed=5)
    # three choices, their own seeds (derived from 5): indexed 0..2, not all the same
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert len({c.text for c in got.choices}) > 1
    assert got.usage.completion_tokens == sum(len(extra(c, "token_ids")) for c in got.choices)
    chunks = await stream(pipe, tenant, n=3, temperature=1.0, seed=5)
    texts = ["", "", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
    # streamed, interleaved by index: each index's text is that choice's
    assert texts == [c.text for c in got.choices]


# case -> (create() arguments, the param named)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "suffix": ({"suffix": "and so on"}, "suffix"),  # no fill-in-the-middle
    "echo": ({"echo": True}, "echo"),
    "greedy n": ({"n": 2}, "n"),  # n > 1 needs sampling
    "batch of prompts": ({"prompt": ["a", "b"]}, "prompt"),
    "max_tokens 0": ({"max_tokens": 0}, "max_tokens"),
    "logprobs over 20": ({"logprobs": 21}, "logprobs"),  # OpenAI's bound on alternatives
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_refusals_are_one_line_400s_naming_the_param(pipe: RunningPipeline, tenant: str, case: str) -> None:
    fields, param = REFUSED[case]
    body = await bad_request_body(complete(pipe, tenant, **fields))
    # an invalid request, naming the field
    assert body["type"] == "invalid_request_error" and body["param"] == param, body
    assert pipe.inflight == 0
