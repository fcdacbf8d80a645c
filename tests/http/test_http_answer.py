"""The OpenAI-compatible endpoint answers exactly what gRPC answers: the same engine, the same
request, the same tokens; streaming and not; usage, finish_reason and the documents extension.

One pipeline for the module (gRPC servers and the HTTP endpoint on port 0); every test uses its
own tenant. Past sessions are off ([limits] default_m=0) so that asking the same question over gRPC
and then over HTTP assembles the same prompt.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from lookahead_rag.v1 import generator_pb2
from tests.http.helpers import ask, extra, model, openai_client, raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, module_pipeline, params

pytestmark = module_loop

N = 16  # max_tokens of the answers here: each runs to this limit
TOKEN_IDS = {"return_token_ids": True}

pipe = module_pipeline(limits={"default_m": 0})


async def complete(p: RunningPipeline, tenant: str, **kw: Any) -> Any:
    kw.setdefault("messages", ask(QUESTION))
    kw.setdefault("max_tokens", N)
    async with openai_client(p, tenant) as client:
        return await client.chat.completions.create(model=model(p), extra_body=TOKEN_IDS, **kw)


async def stream_chunks(p: RunningPipeline, tenant: str, **kw: Any) -> list[Any]:
    async with openai_client(p, tenant) as client:
        stream = await client.chat.completions.create(
            model=model(p), messages=ask(QUESTION), max_tokens=N, stream=True,
            stream_options={"include_usage": True}, extra_body=TOKEN_IDS, **kw)
        return [chunk async for chunk in stream]


async def test_completion_equals_the_grpc_answer(pipe: RunningPipeline, tenant: str) -> None:
    grpc_answer = await pipe.answer(tenant, max_new_tokens=N)
    final = grpc_answer.final
    assert final is not None
    got = await complete(pipe, tenant)
    (choice,) = got.choices
    # the same text and the same tokens as the gRPC Answer for the same request
    assert choice.message.content == final.answer_text and choice.message.role == "assistant"
    assert extra(choice, "token_ids") == list(final.output_ids)
    assert extra(got, "prompt_token_ids") == list(final.prompt_ids)
    # usage counts the assembled prompt and the generated tokens
    assert got.usage.prompt_tokens == len(final.prompt_ids)
    assert got.usage.completion_tokens == final.stats.new_tokens == N
    assert got.usage.total_tokens == len(final.prompt_ids) + N
    # the answer ran to max_tokens
    assert final.stats.finish_reason == "length" and choice.finish_reason == "length"
    # the documents extension: the retrieved chunks the answer was grounded on, in order
    docs = extra(got, "documents")
    assert [d["chunk_id"] for d in docs] == [c.chunk_id for c in final.documents] and docs
    assert all(d["doc_id"] and d["title"] and d["text"] and d["score"] > 0 for d in docs)
    assert got.object == "chat.completion" and got.model == model(pipe) and got.id.startswith("chatcmpl-")


async def test_stream_concatenates_to_the_completion(pipe: RunningPipeline, tenant: str) -> None:
    whole = await complete(pipe, tenant)
    chunks = await stream_chunks(pipe, tenant)
    *content, finish, last = chunks
    # the deltas add up to the non-streamed answer, text and tokens
    assert "".join(c.choices[0].delta.content or "" for c in content) == whole.choices[0].message.content
    assert [t for c in content for t in extra(c.choices[0], "token_ids")] == extra(whole.choices[0], "token_ids")
    # the first delta carries the role; only the finish chunk has a finish_reason
    assert content[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].finish_reason is None for c in content)
    assert finish.choices[0].finish_reason == "length"
    # the finish chunk carries the documents (and the prompt ids) of the non-streamed answer
    assert extra(finish, "documents") == extra(whole, "documents")
    assert extra(finish, "prompt_token_ids") == extra(whole, "prompt_token_ids")
    # include_usage: one last chunk with no choices and the usage; null usage before it
    assert last.choices == [] and last.usage == whole.usage
    assert all(c.usage is None for c in [*content, finish])
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)


async def test_stream_is_server_sent_events_ending_in_done(pipe: RunningPipeline, tenant: str) -> None:
    body = {"messages": ask(QUESTION), "max_tokens": 4, "stream": True}
    async with raw_client(pipe) as http:
        response = await http.post("/v1/chat/completions", json=body, headers={"x-tenant": tenant})
    # text/event-stream: "data: {json}" events separated by blank lines, ending in "data: [DONE]"
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    objects = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert objects[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in objects[-1]


async def test_stop_string_ends_the_answer_as_over_grpc(pipe: RunningPipeline, tenant: str) -> None:
    plain = (await pipe.answer(tenant, max_new_tokens=N)).final
    assert plain is not None
    words = plain.answer_text.split()
    stop = words[len(words) // 2]  # a word from the middle of the plain answer
    grpc_final = (await pipe.answer(tenant, max_new_tokens=N, stop=[stop])).final
    assert grpc_final is not None and grpc_final.stats.finish_reason == "stop"
    got = await complete(pipe, tenant, stop=stop)  # a string, as OpenAI allows
    # stopped where gRPC stops, reported as OpenAI's "stop"
    assert got.choices[0].message.content == grpc_final.answer_text
    assert extra(got.choices[0], "token_ids") == list(grpc_final.output_ids)
    assert got.choices[0].finish_reason == "stop"


async def test_sampling_params_reach_the_engine(pipe: RunningPipeline, tenant: str) -> None:
    sampling = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
    grpc_final = (await pipe.answer(tenant, max_new_tokens=N, **sampling)).final
    assert grpc_final is not None and grpc_final.stats.sampled and grpc_final.stats.seed == 7
    got = await complete(pipe, tenant, **sampling)
    # the same seeded draws: the same tokens as the gRPC answer with the same parameters
    assert extra(got.choices[0], "token_ids") == list(grpc_final.output_ids)
    greedy_final = (await pipe.answer(tenant, max_new_tokens=N)).final
    assert greedy_final is not None
    assert list(grpc_final.output_ids) != list(greedy_final.output_ids)  # sampling changed the answer


async def test_rag_false_decodes_the_messages_as_grpc_generate(pipe: RunningPipeline, tenant: str) -> None:
    messages = [{"role": "system", "content": "Answer in one sentence."}, *ask("What is a CSV file?")]
    request = generator_pb2.GenerateRequest(tenant=tenant, params=params(max_new_tokens=N), messages=(
        generator_pb2.ChatMessages(messages=[generator_pb2.ChatMessage(**m) for m in messages])))
    grpc_final = (await pipe.generate(request)).final
    assert grpc_final is not None
    async with openai_client(pipe, tenant) as client:
        got = await client.chat.completions.create(model=model(pipe), messages=messages, max_tokens=N,
                                                   extra_body={**TOKEN_IDS, "rag": False})
    # no retrieval: the chat template of the messages, decoded exactly as Generate does
    assert extra(got, "prompt_token_ids") == list(grpc_final.prompt_ids)
    assert extra(got.choices[0], "token_ids") == list(grpc_final.output_ids)
    assert extra(got, "documents") == []


async def test_models_lists_the_served_model(pipe: RunningPipeline) -> None:
    async with openai_client(pipe) as client:
        listed = [m.id async for m in client.models.list()]
        one = await client.models.retrieve(model(pipe))
        try:
            await client.models.retrieve("gpt-4o")
            raise AssertionError("an unknown model was found")
        except openai.NotFoundError as err:
            unknown = err
    # exactly the [model] name, retrievable by it; another name is a 404
    assert listed == [model(pipe)] and one.id == model(pipe)
    assert unknown.status_code == 404 and "gpt-4o" in unknown.body["message"]  # type: ignore[index]


async def test_health_follows_whether_the_endpoint_serves(pipe: RunningPipeline, tenant: str) -> None:
    http_server = pipe.pipeline.http
    assert http_server is not None
    async with raw_client(pipe) as http:
        # serving: 200
        assert (await http.get("/health")).status_code == 200
        http_server.front.serving = False  # what stop() does first
        try:
            # stopping: /health says 503 and new completions are refused with 503
            assert (await http.get("/health")).status_code == 503
            refused = await http.post("/v1/chat/completions", json={"messages": ask(QUESTION)},
                                      headers={"x-tenant": tenant})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
        finally:
            http_server.front.serving = True
        assert (await http.get("/health")).json() == {"status": "serving"}
