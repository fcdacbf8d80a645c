"""Conversations over the OpenAI endpoint in RAG mode, and its max_tokens rule, with the real ``openai``
client: the prompt holds the conversation (its system messages and turns, then the question), the
oldest turns are cut first when it does not fit and the answer says how many stayed (JSON, final
chunk, header), a follow-up is searched with the user turn before it, gRPC's Answer takes the same
history; ``max_tokens`` omitted is up to the context within the limit, and over the limit is clamped.

One pipeline for the module: prompts capped at ``CONTEXT_CAP`` tokens so that long turns must be cut,
past sessions off so that the same request assembles the same prompt.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from lookahead_rag.services.http.translate import HISTORY_TURNS_HEADER
from lookahead_rag.v1 import generator_pb2
from tests.http.helpers import TENANT_HEADER, extra, model, openai_client, raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, collect, module_loop, module_pipeline, params

pytestmark = module_loop

N = 4  # max_tokens of the answers whose length does not matter here
LIMIT = 24  # [limits] max_new_tokens
DEFAULT = 6  # [limits] default_max_new_tokens (what gRPC's max_new_tokens 0 means)
CONTEXT_CAP = 700  # [retriever] max_context_tokens: the prompt budget is this minus max_tokens
SMALL_ROOM = 5  # the context's room after the prompt in the "up to the context" case
TOKEN_IDS = {"return_token_ids": True}
CONV_SYSTEM = "Answer in one short sentence."
FILLER = " Here is some more context about this step." * 12  # makes a turn long: ~100 tokens

pipe = module_pipeline(limits={"default_m": 0, "max_new_tokens": LIMIT, "default_max_new_tokens": DEFAULT},
                       retriever={"max_context_tokens": CONTEXT_CAP})


def conversation(turns: int, filler: str = "", question: str = QUESTION) -> list[dict[str, str]]:
    """A system message, ``turns`` turns (user, assistant) marked "turn <n>", then ``question``."""
    messages = [{"role": "system", "content": CONV_SYSTEM}]
    for n in range(1, turns + 1):
        messages += [{"role": "user", "content": f"Question of turn {n}?{filler}"},
                     {"role": "assistant", "content": f"Answer of turn {n}.{filler}"}]
    return [*messages, {"role": "user", "content": question}]


async def complete(p: RunningPipeline, tenant: str, **kw: Any) -> Any:
    async with openai_client(p, tenant) as client:
        extra_body = {**TOKEN_IDS, **kw.pop("extra_body", {})}
        return await client.chat.completions.create(model=model(p), extra_body=extra_body, **kw)


async def post(p: RunningPipeline, tenant: str, body: dict[str, Any]) -> Any:
    async with raw_client(p) as http:
        return await http.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: tenant})


def prompt_text(p: RunningPipeline, got: Any) -> str:
    return str(p.tokenizer.decode(extra(got, "prompt_token_ids")))


async def test_prompt_holds_the_conversation(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant, messages=conversation(2), max_tokens=N)
    text = prompt_text(pipe, got)
    # the documents, the conversation's system message, both turns in order, then the question
    parts = ["json.dumps", CONV_SYSTEM, "Question of turn 1?", "Answer of turn 1.", "Question of turn 2?",
             "Answer of turn 2.", QUESTION]
    positions = [text.index(part) for part in parts]
    assert positions == sorted(positions), positions
    assert text.endswith(f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    # every turn was kept, and the answer says so
    assert extra(got, "history_turns_kept") == 2
    assert extra(got, "documents")


async def test_oldest_turns_are_cut_and_counted(pipe: RunningPipeline, tenant: str) -> None:
    messages = conversation(6, FILLER)
    body = {"messages": messages, "max_tokens": N, **TOKEN_IDS}
    response = await post(pipe, tenant, body)
    assert response.status_code == 200, response.text
    got = response.json()
    kept = got["history_turns_kept"]
    text = str(pipe.tokenizer.decode(got["prompt_token_ids"]))
    # the budget holds some turns, not all: the newest `kept`, whole; the older ones are cut
    assert 0 < kept < 6 and len(got["prompt_token_ids"]) <= CONTEXT_CAP - N
    for n in range(1, 7):
        newest = n > 6 - kept
        assert (f"Question of turn {n}?" in text) == newest and (f"Answer of turn {n}." in text) == newest
    # the conversation's system message and the question are never cut
    assert CONV_SYSTEM in text and QUESTION in text
    # the count is a response header too
    assert response.headers[HISTORY_TURNS_HEADER] == str(kept)


async def test_stream_reports_the_turns_kept(pipe: RunningPipeline, tenant: str) -> None:
    body = {"messages": conversation(2), "max_tokens": N, "stream": True,
            "stream_options": {"include_usage": True}}
    response = await post(pipe, tenant, body)
    assert response.status_code == 200, response.text
    events = [json.loads(e.removeprefix("data: ")) for e in response.text.split("\n\n")[:-2]]
    finish = next(e for e in events if e["choices"] and e["choices"][0]["finish_reason"])
    # the finish chunk carries the count (beside the documents), the header says it before the first token
    assert finish["history_turns_kept"] == 2 and finish["documents"]
    assert response.headers[HISTORY_TURNS_HEADER] == "2"
    # the usage chunk says how many tokens the answer was allowed
    assert events[-1]["usage"]["max_tokens_allowed"] == N


async def test_follow_up_is_searched_with_the_previous_turn(pipe: RunningPipeline, tenant: str) -> None:
    earlier = {"csv.reader": "How do I read the rows of a csv file?",
               "pathlib.Path": "How do I check whether a filesystem path exists?"}
    for doc_id, previous in earlier.items():
        messages = [{"role": "user", "content": previous}, {"role": "assistant", "content": "Let me look."},
                    {"role": "user", "content": "and what about it?"}]
        got = await complete(pipe, tenant, messages=messages, max_tokens=1, extra_body={"k": 1})
        # the same vague follow-up finds the document its previous user turn was about
        assert [d["doc_id"] for d in extra(got, "documents")] == [doc_id]


async def test_grpc_answer_takes_the_same_history(pipe: RunningPipeline, tenant: str) -> None:
    messages = conversation(2)
    got = await complete(pipe, tenant, messages=messages, max_tokens=N)
    history = [generator_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages[:-1]]
    request = generator_pb2.AnswerRequest(tenant=tenant, question=QUESTION, params=params(max_new_tokens=N),
                                          history=history)
    final = (await collect(pipe.stub.Answer(request, timeout=300))).final
    assert final is not None
    # the same prompt and the same answer over both doors; the stats count the turns kept
    assert list(final.prompt_ids) == extra(got, "prompt_token_ids")
    assert list(final.output_ids) == extra(got.choices[0], "token_ids")
    assert final.stats.history_turns_kept == 2 and final.stats.max_new_tokens == N


@pytest.mark.parametrize(("messages", "words"), [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}, {"role": "user", "content": QUESTION}],
     ("history message 1", "'tool'")),  # a role a conversation turn cannot have
    ([{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Sure."}],
     ("last message", "'assistant'")),  # the last message must be the question
])
async def test_bad_conversation_is_400(pipe: RunningPipeline, tenant: str, messages: list[dict[str, str]],
                                       words: tuple[str, ...]) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(pipe, tenant, messages=messages, max_tokens=N)
    body = caught.value.body
    assert isinstance(body, dict) and all(w in body["message"] for w in words), body
    assert "\n" not in body["message"]


# ---- max_tokens ----------------------------------------------------------------------------------------
async def test_max_tokens_omitted_is_up_to_the_limit(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant, messages=[{"role": "user", "content": QUESTION}])
    # the model's context is far larger than prompt + LIMIT: the answer may take the whole limit, not the default
    assert got.usage.model_extra["max_tokens_allowed"] == LIMIT
    assert DEFAULT < got.usage.completion_tokens <= LIMIT


async def test_max_tokens_omitted_is_up_to_the_context(pipe: RunningPipeline, tenant: str) -> None:
    question = [{"role": "user", "content": QUESTION}]
    prompt_tokens = (await complete(pipe, tenant, messages=question, max_tokens=1)).usage.prompt_tokens
    engine = pipe.generator
    saved, engine.context_tokens = engine.context_tokens, prompt_tokens + SMALL_ROOM
    try:
        got = await complete(pipe, tenant, messages=question)
    finally:
        engine.context_tokens = saved
    # the context's room after the prompt (less than the limit) is what the answer was allowed
    assert got.usage.prompt_tokens == prompt_tokens
    assert got.usage.model_extra["max_tokens_allowed"] == SMALL_ROOM
    assert got.usage.completion_tokens <= SMALL_ROOM


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("asked", [LIMIT + 1, 10**12])
async def test_max_tokens_over_the_limit_is_clamped(pipe: RunningPipeline, tenant: str, field: str,
                                                    asked: int) -> None:
    got = await complete(pipe, tenant, messages=[{"role": "user", "content": QUESTION}], **{field: asked})
    # not a 400: the answer may take the limit, and the usage says so
    assert got.usage.model_extra["max_tokens_allowed"] == LIMIT
    assert got.usage.completion_tokens <= LIMIT


async def test_max_tokens_within_the_limit_is_as_asked(pipe: RunningPipeline, tenant: str) -> None:
    got = await complete(pipe, tenant, messages=[{"role": "user", "content": QUESTION}], max_completion_tokens=N)
    # a value within the limit is the request's own
    assert got.usage.model_extra["max_tokens_allowed"] == N and got.usage.completion_tokens == N


@pytest.mark.parametrize("asked", [LIMIT + 1, None])
async def test_no_retrieval_paths_follow_the_same_max_tokens_rule(pipe: RunningPipeline, tenant: str,
                                                                  asked: int | None) -> None:
    kw = {} if asked is None else {"max_tokens": asked}
    question = [{"role": "user", "content": QUESTION}]
    plain = await complete(pipe, tenant, messages=question, extra_body={"rag": False}, **kw)
    async with openai_client(pipe, tenant) as client:
        legacy = await client.completions.create(model=model(pipe), prompt=QUESTION, **kw)
    # chat without retrieval and /v1/completions: over the limit is clamped, omitted is up to the context
    # (far larger than the limit here): the whole limit, not the default, and the usage says so
    for got in (plain, legacy):
        assert got.usage.model_extra["max_tokens_allowed"] == LIMIT
        assert got.usage.completion_tokens <= LIMIT
