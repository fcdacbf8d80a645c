"""Generator through the whole pipeline on real gRPC (loopback, port 0): answers equal plain greedy
decoding of the same assembled prompt, the feedback loop makes a repeated question cheaper, tenants
never see each other's drafts or past sessions, health and reflection.

One pipeline for the module; every test uses its own tenant. Past sessions are off by default here
([limits] default_m=0) so a repeated question has the same prompt; tests that want them
ask for m explicitly.
"""

from __future__ import annotations

import threading

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from lookahead_core.threads import new_thread_default, usable_cores

from lookahead_rag.services.draftcache.servicer import SERVICE_NAME as DRAFTCACHE_SERVICE
from lookahead_rag.services.generator.servicer import SERVICE_NAME as GENERATOR_SERVICE
from lookahead_rag.services.retriever.past_answers import cut_answer
from lookahead_rag.services.retriever.servicer import SERVICE_NAME as RETRIEVER_SERVICE
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc, generator_pb2
from tests.pipeline.helpers import QUESTION, RunningPipeline, greedy, module_loop, module_pipeline, params

pytestmark = module_loop

N = 24  # max_new_tokens of most answers here
MODES = ["hierarchical", "parallel", "llma", "none"]
CSV_QUESTION = "How do I read the rows of a CSV file?"


pipe = module_pipeline(limits={"default_m": 0}, generator={"tenant_modes": {"*": MODES}})  # every tenant: MODES


@pytest.mark.parametrize("mode", MODES)
async def test_answer_streams_plain_greedy_of_the_assembled_prompt(pipe: RunningPipeline, tenant: str,
                                                             mode: str) -> None:
    cold = await pipe.answer(tenant, max_new_tokens=N, mode=mode)
    final = cold.final
    assert final is not None
    assert cold.text == final.answer_text and final.answer_text.strip()
    assert cold.streamed_ids == list(final.output_ids)
    assert final.stats.new_tokens == len(final.output_ids) == N  # this answer runs to the limit
    assert final.stats.finish_reason == "length"
    # The prompt is the retriever's grounded prompt for the same request (k default, no sessions).
    expected = pipe.pipeline.retriever.retrieve(tenant, QUESTION, pipe.generator.limits.default_k, 0, N)
    assert list(final.prompt_ids) == expected.prompt_ids
    assert final.stats.documents_available and final.stats.drafts_available
    assert [d.chunk_id for d in final.documents] == [c.chunk.chunk_id for c in expected.chunks]
    assert "indent=2" in pipe.tokenizer.decode(list(final.prompt_ids))
    assert list(final.output_ids) == greedy(pipe.model, final.prompt_ids, N)
    # Alone in the engine: every forward it rode in carried it only; drafts were budgeted unless mode none.
    stats = final.stats
    assert stats.max_batch_size == 1 and stats.mean_batch_size == 1 and stats.mean_tokens_per_forward >= 1
    assert stats.prefix_hit_tokens == 0  # a new tenant: no cached prompt KV
    kernels = {"stock", "split", "fused", "onednn", "wmajor", "rows", "packed"}
    assert stats.kernel and set(stats.kernel.split(",")) <= kernels
    assert (stats.mean_draft_budget > 0) == (mode != "none")
    if mode == "none":  # no drafts: one token per forward (the first comes from the prefill)
        assert final.stats.forward_steps == N - 1
        return
    # The finished answer fed the tenant's draft cache: the same prompt again is decoded from its
    # own past output, in far fewer forwards, and the tokens do not change.
    await pipe.drain()
    warm = await pipe.answer(tenant, max_new_tokens=N, mode=mode)
    assert warm.final is not None
    assert list(warm.final.prompt_ids) == list(final.prompt_ids)
    assert list(warm.final.output_ids) == list(final.output_ids)
    assert warm.text == cold.text
    assert warm.final.stats.draft_tokens_from_cache > 0
    assert warm.final.stats.forward_steps < final.stats.forward_steps


async def test_repeated_question_drafts_from_its_past_answer_and_takes_fewer_steps(pipe: RunningPipeline,
                                                                                tenant: str) -> None:
    first = await pipe.answer(tenant, m=2, max_new_tokens=N)
    assert first.final is not None
    await pipe.drain()
    # The GenerationCompleted event carried the answer to both consumers.
    (event,) = pipe.events.for_tenant(tenant)
    assert event.question == QUESTION and event.answer_text == first.final.answer_text
    assert list(event.prompt_ids) == list(first.final.prompt_ids)
    assert list(event.output_ids) == list(first.final.output_ids)
    assert event.tokenizer_id == pipe.generator.tokenizer_id and event.event_id
    assert event.stats.new_tokens == first.final.stats.new_tokens
    assert list(event.citations) == list(first.final.citations)  # the passages supporting it, in both
    texts = {d.chunk_id: d.text for d in first.final.documents}
    assert all(texts[c.chunk_id][c.start:c.end] == c.quote for c in first.final.citations)
    assert [s.outputs for s in pipe.pipeline.draftcache.stats(tenant)] == [1]
    assert pipe.pipeline.retriever.stats(tenant).sessions == 1

    second = await pipe.answer(tenant, m=2, max_new_tokens=N)
    final = second.final
    assert final is not None
    # the past answer feeds the drafts, not the prompt ([retriever] past_answers_in_prompt is off): same prompt
    assert list(final.prompt_ids) == list(first.final.prompt_ids)
    assert list(final.output_ids) == greedy(pipe.model, final.prompt_ids, N)
    assert second.text == final.answer_text
    assert final.stats.forward_steps < first.final.stats.forward_steps
    assert final.stats.mean_accepted_per_step > first.final.stats.mean_accepted_per_step


STOPS = ["dumps", "\n"]  # both occur in this answer's greedy output (it names json.dumps)


@pytest.mark.parametrize("stop", STOPS)
async def test_stop_string_ends_the_answer_before_it(pipe: RunningPipeline, tenant: str, stop: str) -> None:
    got = await pipe.answer(tenant, max_new_tokens=N, stop=[stop])
    final = got.final
    assert final is not None
    assert final.stats.finish_reason == "stop"
    ids = list(final.output_ids)
    assert ids == greedy(pipe.model, final.prompt_ids, N)[: len(ids)]  # a prefix of plain greedy
    full = pipe.tokenizer.decode(ids, skip_special_tokens=True)
    assert full.endswith(stop) or stop in full[len(final.answer_text):]  # the last token completed it
    assert stop not in final.answer_text and full.startswith(final.answer_text)
    (event,) = pipe.events.for_tenant(tenant)
    assert event.answer_text == final.answer_text


@pytest.mark.parametrize("stop", STOPS)
async def test_streamed_text_never_passes_a_stop_string(pipe: RunningPipeline, tenant: str, stop: str) -> None:
    got = await pipe.answer(tenant, max_new_tokens=N, stop=[stop])
    assert got.final is not None and got.final.stats.finish_reason == "stop"
    assert stop not in got.text
    assert got.text == got.final.answer_text


async def test_generate_with_chat_messages_equals_greedy(pipe: RunningPipeline, tenant: str) -> None:
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three uses of the Python csv module."},
    ]
    request = generator_pb2.GenerateRequest(
        tenant=tenant,
        messages=generator_pb2.ChatMessages(messages=[generator_pb2.ChatMessage(**m) for m in messages]),
        params=params(max_new_tokens=N),
    )
    got = await pipe.generate(request)
    final = got.final
    assert final is not None
    templated = pipe.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert list(final.prompt_ids) == list(templated)
    assert list(final.output_ids) == greedy(pipe.model, final.prompt_ids, N)
    assert got.text == final.answer_text and got.streamed_ids == list(final.output_ids)


async def test_generate_with_raw_prompt_and_references_equals_greedy(pipe: RunningPipeline, tenant: str) -> None:
    prompt = "Question: What does json.dumps do?\nAnswer:"
    reference = "json.dumps serializes obj to a JSON formatted str; indent=2 pretty-prints it."
    request = generator_pb2.GenerateRequest(
        tenant=tenant, prompt=prompt, references=[reference],
        reference_ids=pipe.tokenizer("sort_keys=True sorts the keys", add_special_tokens=False)["input_ids"],
        params=params(max_new_tokens=N),
    )
    got = await pipe.generate(request)
    final = got.final
    assert final is not None
    assert list(final.prompt_ids) == list(pipe.tokenizer(prompt)["input_ids"])
    assert list(final.output_ids) == greedy(pipe.model, final.prompt_ids, N)
    assert got.text == final.answer_text and got.streamed_ids == list(final.output_ids)


async def test_generate_with_prompt_ids_decodes_them_verbatim_and_equals_greedy(pipe: RunningPipeline,
                                                                               tenant: str) -> None:
    tok = pipe.tokenizer
    # "Answer" spelt one character per token: tokenizing (or templating) the text again would merge them
    spelt = [tok.convert_tokens_to_ids(ch) for ch in "Answer"]
    ids = [*tok("Question: What does json.dumps do?\n")["input_ids"], *spelt, *tok(":")["input_ids"]]
    assert ids != tok(tok.decode(ids))["input_ids"]
    request = generator_pb2.GenerateRequest(tenant=tenant, prompt_ids=generator_pb2.TokenIds(ids=ids),
                                            params=params(max_new_tokens=N))
    got = await pipe.generate(request)
    final = got.final
    assert final is not None
    assert list(final.prompt_ids) == ids
    assert list(final.output_ids) == greedy(pipe.model, ids, N)
    assert got.streamed_ids == list(final.output_ids) and got.text == final.answer_text


async def test_tenant_b_answers_never_reach_tenant_a(pipe: RunningPipeline, tenant: str) -> None:
    tenant_a, tenant_b = tenant, pipe.new_tenant("tenant-b")
    b1 = await pipe.answer(tenant_b, question=CSV_QUESTION, m=2, max_new_tokens=N)
    await pipe.drain()
    b2 = await pipe.answer(tenant_b, question=CSV_QUESTION, m=2, max_new_tokens=N)
    await pipe.drain()
    assert b1.final is not None and b2.final is not None
    tok = pipe.generator.tokenizer_id
    prompt_ids = list(b2.final.prompt_ids)  # contains tenant B's first answer (a past session)

    async with grpc.aio.insecure_channel(pipe.target("draftcache")) as ch:
        drafts = draftcache_pb2_grpc.DraftCacheStub(ch)

        async def fetch(t: str) -> draftcache_pb2.FetchResponse:
            req = draftcache_pb2.FetchRequest(tenant=t, tokenizer_id=tok, prompt_ids=prompt_ids,
                                              reference_ids=list(b1.final.output_ids), budget=4096)
            return await drafts.Fetch(req, timeout=60)

        own = await fetch(tenant_b)
        other = await fetch(tenant_a)
    assert own.tokens > 0  # control: B's outputs are there for B
    assert other.tokens == 0 and not other.continuations

    core = pipe.pipeline.retriever  # past sessions feed the drafts, not the prompt: read them in process

    def sessions(t: str) -> list[str]:
        return [h.session.answer for h in core.sessions.search(t, core.embedder.encode_one(CSV_QUESTION), 5)]

    assert cut_answer(b1.final.answer_text) in sessions(tenant_b)
    assert sessions(tenant_a) == []

    a = await pipe.answer(tenant_a, question=CSV_QUESTION, m=2, max_new_tokens=N)
    assert a.final is not None
    assert a.final.stats.draft_tokens_from_cache == 0
    assert b1.final.answer_text not in pipe.tokenizer.decode(list(a.final.prompt_ids))
    await pipe.drain()
    assert [s.outputs for s in pipe.pipeline.draftcache.stats(tenant_b)] == [2]
    assert [s.outputs for s in pipe.pipeline.draftcache.stats(tenant_a)] == [1]  # A's own answer only
    assert pipe.pipeline.retriever.stats(tenant_a).sessions == 1


async def test_health_serving_and_reflection_lists_the_generator(pipe: RunningPipeline) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert await pipe.health(GENERATOR_SERVICE) == serving
    assert await pipe.health("") == serving
    assert await pipe.health(RETRIEVER_SERVICE, pipe.target("retriever")) == serving
    assert await pipe.health(DRAFTCACHE_SERVICE, pipe.target("draftcache")) == serving
    with pytest.raises(grpc.RpcError) as info:
        await pipe.health("lookahead_rag.v1.NoSuchService")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]

    async with grpc.aio.insecure_channel(pipe.target()) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = [r async for r in stub.ServerReflectionInfo(iter([request]), timeout=60)]
    names = {s.name for s in reply.list_services_response.service}
    assert GENERATOR_SERVICE == "lookahead_rag.v1.Generator"
    assert {GENERATOR_SERVICE, "grpc.health.v1.Health"} <= names


async def test_only_the_engine_thread_runs_torch_on_several_threads(pipe: RunningPipeline, tenant: str) -> None:
    # A serving process puts every thread but the engine's on one intra-op thread, or their OpenMP
    # pools would throttle each other (lookahead_core.threads); the engine's thread claims its own count.
    engine = pipe.generator.scheduler
    assert new_thread_default() == 1
    assert engine.threads == (pipe.pipeline.settings.generator.threads or usable_cores())
    seen: set[tuple[str, int]] = set()  # (thread, intra-op threads) of every forward of the engine's twins
    hooks = [twin.register_forward_pre_hook(lambda *_: seen.add((threading.current_thread().name,
                                                                  torch.get_num_threads())))
             for twin in engine.backend.modules()]
    try:
        answer = await pipe.answer(tenant, max_new_tokens=4, mode="none")
    finally:
        for hook in hooks:
            hook.remove()
    assert answer.final is not None
    assert seen == {("step-scheduler", engine.threads)}
