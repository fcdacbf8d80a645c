"""Issue 22 item 6 (stats): a tenant's key learns nothing about other tenants from the stats it may read.
``Retriever.Stats(tenant=X)`` names X alone (every tenant's name only for a ``*`` or admin caller
asking with no tenant), and an answer's final stats carry the engine's load (batch sizes, queue wait,
tokens per forward: other tenants' traffic) only for an admin key; /metrics keeps them. With auth off
the final stats are as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, fields

import grpc
import pytest
import pytest_asyncio

from lookahead_rag.services.common.auth.callers import Principal, sees_engine_load
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.scopes import Scope
from lookahead_rag.services.common.telemetry.metric_group import NS
from lookahead_rag.services.generator.convert import LOAD_FIELDS, chunk_to_proto
from lookahead_rag.services.generator.domain import FinalInfo, GenerationStats
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from tests.pipeline.helpers import QUESTION, Answered, RunningPipeline, collect, module_loop, params, running_pipeline
from tests.services.auth_cases import md

pytestmark = module_loop

MINE, THEIRS = "leak-mine", "leak-theirs"
MAX_NEW = 4
TIMEOUT_S = 300.0
LOADED = GenerationStats(new_tokens=3, queue_wait_s=0.25, mean_batch_size=3.5, max_batch_size=5,
                         mean_tokens_per_forward=40.0, finish_reason="eos")


@dataclass
class Secured:
    p: RunningPipeline
    tokens: dict[str, str]
    channel: dict[str, grpc.aio.Channel]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    root = tmp_path_factory.mktemp("leaks")
    keys = KeyFile(root / "keys.json")
    _, service_key = keys.add(["*"], "services")
    tokens = {"mine": keys.add([MINE], "mine")[1], "ops": keys.add(["*"], "ops", ["admin"])[1],
              "star": service_key}
    auth = {"mode": "required", "keys_file": keys.path, "service_key": service_key}
    async with running_pipeline(root, auth=auth) as p:
        p.ingest(MINE)
        p.ingest(THEIRS)
        channels = {name: grpc.aio.insecure_channel(p.target(name)) for name in ("generator", "retriever")}
        try:
            yield Secured(p, tokens, channels)
        finally:
            for channel in channels.values():
                await channel.close()


async def stats(s: Secured, tenant: str, who: str) -> retriever_pb2.RetrieverStatsResponse:
    stub = retriever_pb2_grpc.RetrieverStub(s.channel["retriever"])
    return await stub.Stats(retriever_pb2.RetrieverStatsRequest(tenant=tenant), metadata=md(s.tokens[who]))


async def answer(s: Secured, who: str) -> Answered:
    stub = generator_pb2_grpc.GeneratorStub(s.channel["generator"])
    request = generator_pb2.AnswerRequest(tenant=MINE, question=QUESTION, params=params(max_new_tokens=MAX_NEW))
    return await collect(stub.Answer(request, metadata=md(s.tokens[who]), timeout=TIMEOUT_S))


async def test_stats_of_a_tenant_name_no_other_tenant(secured: Secured) -> None:
    mine = await stats(secured, MINE, "mine")
    assert list(mine.tenants) == [MINE] and mine.chunks > 0
    with pytest.raises(grpc.aio.AioRpcError) as err:  # every tenant: not with a one-tenant key
        await stats(secured, "", "mine")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # a caller of every tenant asking with no tenant: every name (the generator's own check does this)
    for who in ("ops", "star"):
        assert {MINE, THEIRS} <= set((await stats(secured, "", who)).tenants), who
    # an admin asking about one tenant: that one
    assert list((await stats(secured, THEIRS, "ops")).tenants) == [THEIRS]


async def test_the_engine_load_in_final_stats_is_for_admin_keys_only(secured: Secured) -> None:
    tenant_view = (await answer(secured, "mine")).final
    assert tenant_view is not None and tenant_view.stats.new_tokens > 0  # the request's own stats stay
    blank = type(tenant_view.stats)()  # every load field at its default: zero, or empty for the kernel
    assert {f: getattr(tenant_view.stats, f) for f in LOAD_FIELDS} == {f: getattr(blank, f) for f in LOAD_FIELDS}
    admin_view = (await answer(secured, "ops")).final
    assert admin_view is not None
    assert admin_view.stats.max_batch_size >= 1 and admin_view.stats.mean_batch_size >= 1  # it rode a forward
    # Prometheus keeps the engine's load for operators
    registry = secured.p.pipeline.registry
    assert (registry.get_sample_value(f"{NS}_generator_tokens_per_forward_count") or 0) > 0


async def test_with_auth_off_the_final_stats_are_as_before() -> None:  # async: the module's mark
    final = FinalInfo(request_id="r", stats=LOADED)
    assert sees_engine_load(None)  # auth off: no principal is bound
    wire = chunk_to_proto(final, sees_engine_load(None)).final.stats
    assert (wire.queue_wait_s, wire.mean_batch_size, wire.max_batch_size) == (0.25, 3.5, 5)
    tenant = Principal("key k1", frozenset({MINE}), frozenset({Scope.ANSWER, Scope.WRITE}))
    hidden = chunk_to_proto(final, sees_engine_load(tenant)).final.stats
    assert (hidden.queue_wait_s, hidden.mean_batch_size, hidden.max_batch_size, hidden.new_tokens) == (0, 0, 0, 3)
    assert {f.name for f in fields(GenerationStats)} >= LOAD_FIELDS
