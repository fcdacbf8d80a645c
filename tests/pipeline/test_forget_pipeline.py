"""Forget through the whole pipeline on real gRPC with the real small model (issue 12, item 5).

Ask, let the feedback loop learn the answer (drafts from the tenant's cache, fewer forwards, prefix
KV, a past session), call the retriever's Forget, drain the bus, ask again: nothing drafts from the
cache, the step count is the cold one again, no prefix KV is reused and no past session is
retrieved. A document forget drops only the answers grounded on that document; a tenant's forget
leaves other tenants alone; the same event applied twice changes nothing.

One pipeline for the module, past sessions off by default ([limits] default_m=0) so a repeated
question has the same prompt; k=1 so each answer is grounded on exactly one document.
"""

from __future__ import annotations

import asyncio

import grpc

from lookahead_rag.services.events.forget import CLOCK_SKEW_MS, MS_PER_S, forget_event
from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP, GENERATOR_GROUP, RETRIEVER_GROUP
from lookahead_rag.services.retriever.sessions import SessionRecord
from lookahead_rag.v1 import generator_pb2, retriever_pb2, retriever_pb2_grpc
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, module_pipeline

pytestmark = module_loop

N = 24  # max_new_tokens of every answer here
CSV_QUESTION = "How do I read the rows of a CSV file?"
JSON_DOC, CSV_DOC = "json.dumps", "csv.reader"  # the documents QUESTION and CSV_QUESTION retrieve (k=1)
SESSIONS_M = 5  # past sessions a check asks the retriever for (more than any test makes)
RPC_TIMEOUT_S = 120.0
GROUPS = (DRAFTCACHE_GROUP, RETRIEVER_GROUP, GENERATOR_GROUP)

pipe = module_pipeline(limits={"default_m": 0})


async def ask(p: RunningPipeline, tenant: str, question: str = QUESTION) -> generator_pb2.FinalInfo:
    got = await p.answer(tenant, question, k=1, max_new_tokens=N)
    assert got.final is not None
    return got.final


async def forget(p: RunningPipeline, tenant: str, doc_id: str = "") -> str:
    """The retriever's Forget over gRPC, then a drain: every consumer has applied it."""
    async with grpc.aio.insecure_channel(p.target("retriever")) as channel:
        request = retriever_pb2.ForgetRequest(tenant=tenant, doc_id=doc_id)
        reply = await retriever_pb2_grpc.RetrieverStub(channel).Forget(request, timeout=RPC_TIMEOUT_S)
    await p.drain()
    return reply.event_id


async def past_sessions(p: RunningPipeline, tenant: str, question: str = QUESTION) -> list[SessionRecord]:
    """The tenant's past sessions the retriever holds for ``question`` (read in process: by default they feed
    the drafts and stay out of the prompt, so Retrieve does not return them)."""
    core = p.pipeline.retriever
    return [hit.session for hit in core.sessions.search(tenant, core.embedder.encode_one(question), SESSIONS_M)]


def grounding(final: generator_pb2.FinalInfo) -> list[str]:
    return [d.doc_id for d in final.documents]


async def test_forgetting_a_tenant_makes_its_next_answer_cold(pipe: RunningPipeline, tenant: str) -> None:
    bystander = pipe.new_tenant("forget-bystander")
    cold = await ask(pipe, tenant)
    await ask(pipe, bystander)
    await pipe.drain()
    warm = await ask(pipe, tenant)
    await pipe.drain()
    # control: before the forget the loop has learned the answer (else the checks below prove nothing)
    assert warm.stats.draft_tokens_from_cache > 0
    assert warm.stats.forward_steps < cold.stats.forward_steps
    assert warm.stats.prefix_hit_tokens > 0
    assert await past_sessions(pipe, tenant)

    event_id = await forget(pipe, tenant)
    assert event_id  # the RPC names the event every consumer applied
    # no past session of the tenant is retrieved any more
    assert await past_sessions(pipe, tenant) == []

    after = await ask(pipe, tenant)
    # the same prompt as the first ask and the same answer (drafts never change the answer) ...
    assert list(after.prompt_ids) == list(cold.prompt_ids)
    assert list(after.output_ids) == list(cold.output_ids)
    # ... with nothing drafted from the tenant's cache and the cold step count
    assert after.stats.draft_tokens_from_cache == 0
    assert after.stats.forward_steps == cold.stats.forward_steps
    # no prompt KV of the tenant was reused
    assert after.stats.prefix_hit_tokens == 0

    # the other tenant kept everything: its cache drafts, its prefix KV and its past session
    again = await ask(pipe, bystander)
    assert again.stats.draft_tokens_from_cache > 0
    assert again.stats.prefix_hit_tokens > 0
    assert await past_sessions(pipe, bystander)


async def test_forgetting_a_document_forgets_only_answers_grounded_on_it(pipe: RunningPipeline,
                                                                         tenant: str) -> None:
    csv = await ask(pipe, tenant, CSV_QUESTION)
    await pipe.drain()
    json_cold = await ask(pipe, tenant)  # cold for its question; the csv answer is already cached
    await pipe.drain()
    json_warm = await ask(pipe, tenant)
    await pipe.drain()
    # control: each question is grounded on its one document, and the events say so
    assert grounding(csv) == [CSV_DOC] and grounding(json_cold) == grounding(json_warm) == [JSON_DOC]
    published = pipe.events.for_tenant(tenant)
    assert [list(e.doc_ids) for e in published] == [[CSV_DOC], [JSON_DOC], [JSON_DOC]]
    # control: the json answer was learned
    assert json_warm.stats.draft_tokens_from_cache > json_cold.stats.draft_tokens_from_cache
    assert json_warm.stats.forward_steps < json_cold.stats.forward_steps
    csv_event = published[0].event_id

    await forget(pipe, tenant, JSON_DOC)
    # the past sessions grounded on json.dumps are gone, the csv one stays
    assert [s.event_id for s in await past_sessions(pipe, tenant)] == [csv_event]

    json_after = await ask(pipe, tenant)
    # the cache is what it was before the json answer was learned: the same drafts, the same steps
    assert json_after.stats.draft_tokens_from_cache == json_cold.stats.draft_tokens_from_cache
    assert json_after.stats.forward_steps == json_cold.stats.forward_steps
    assert list(json_after.output_ids) == list(json_cold.output_ids)
    # every prefix KV of the tenant went (any prompt may hold the document)
    assert json_after.stats.prefix_hit_tokens == 0
    # the csv answer is still cached: asked again, it drafts from the cache
    csv_after = await ask(pipe, tenant, CSV_QUESTION)
    assert csv_after.stats.draft_tokens_from_cache > 0
    assert csv_after.stats.forward_steps < csv.stats.forward_steps


async def test_the_same_forget_twice_changes_nothing(pipe: RunningPipeline, tenant: str) -> None:
    p = pipe.pipeline
    await ask(pipe, tenant)
    await pipe.drain()
    event = forget_event(tenant, "", "test-replay")
    p.bus.publish(event)
    await pipe.drain()
    await asyncio.sleep(2 * CLOCK_SKEW_MS / MS_PER_S)  # the next answer begins past the forget's horizon
    await ask(pipe, tenant)  # learned again after the forget
    await pipe.drain()

    def state() -> tuple[object, ...]:
        return (p.draftcache.stats(tenant), p.retriever.stats(tenant).sessions,
                pipe.generator.scheduler.prefix_cache.sequences(tenant))

    before = state()
    # control: there is something the replayed forget could wrongly drop
    assert before[0] and before[1] == 1 and before[2]
    duplicates = {group: p.bus.counters(group).duplicates for group in GROUPS}
    p.bus.publish(event)  # a resend of the very same event
    await pipe.drain()
    # nothing changed: the answer learned since the first delivery is still cached, cited and reused
    assert state() == before
    # every consumer saw it as a duplicate
    assert {group: p.bus.counters(group).duplicates - n for group, n in duplicates.items()} == dict.fromkeys(GROUPS, 1)
