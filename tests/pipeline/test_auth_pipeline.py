"""Callers are bound to tenants, on all three services over real gRPC and on the HTTP endpoint
(``[auth] mode = "required"``): every RPC with a missing, malformed, unknown, revoked or other
tenant's credential is refused with UNAUTHENTICATED or PERMISSION_DENIED and the tenant's data is
never touched; the right key works; the generator reaches the other two with ``service_key``;
``lookahead-rag keys`` changes what the running servers accept.

Refusals aim at the tenant ``victim``; calls that must succeed use ``worker`` (so their answers'
events never change the victim's data while a refusal test compares it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio

from lookahead_rag.services import keys_cli
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.errors import FailedPrecondition
from lookahead_rag.services.draftcache.client import GrpcDraftCacheClient
from lookahead_rag.services.retriever.client import GrpcRetrieverClient
from lookahead_rag.v1 import draftcache_pb2 as dpb
from lookahead_rag.v1 import draftcache_pb2_grpc, generator_pb2, generator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from tests.http.helpers import raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, collect, module_loop, params, running_pipeline
from tests.services.auth_cases import Cases, md
from tests.services.auth_cases import bad_credentials as shared_bad_credentials

pytestmark = module_loop

VICTIM, WORKER, OTHER = "victim", "worker", "other"
MAX_NEW = 4  # answers that must succeed stay short
UNAUTH, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
SERVICES = ("generator", "retriever", "draftcache")
TIMEOUT_S = 300.0


@dataclass
class Secured:
    p: RunningPipeline
    keys: KeyFile
    tokens: dict[str, str]  # who -> key
    channels: dict[str, grpc.aio.Channel]  # service -> a channel to its server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    root = tmp_path_factory.mktemp("auth-pipeline")
    keys = KeyFile(root / "keys.json")
    _, service_key = keys.add(["*"], "services")
    tokens = {who: keys.add(tenants, who, ["admin"] if who == "admin" else ["answer", "write"])[1]
              for who, tenants in {VICTIM: [VICTIM], WORKER: [WORKER], OTHER: [OTHER], "admin": ["*"],
                                   "revoked": [VICTIM]}.items()}
    keys.revoke(next(k.id for k in keys.load() if k.name == "revoked"))
    auth = {"mode": "required", "keys_file": keys.path, "service_key": service_key}
    async with running_pipeline(root, auth=auth) as p:
        p.ingest(VICTIM)
        p.ingest(WORKER)
        p.pipeline.draftcache.add_output(VICTIM, p.generator.tokenizer_id, [11, 12, 13, 14], "victim-past")
        channels = {name: grpc.aio.insecure_channel(p.target(name)) for name in SERVICES}
        try:
            yield Secured(p, keys, tokens, channels)
        finally:
            for channel in channels.values():
                await channel.close()


Rpc = Callable[[Secured, str, Any], Awaitable[Any]]  # (pipeline, tenant, metadata) -> the reply


def _gen(s: Secured) -> generator_pb2_grpc.GeneratorStub:
    return generator_pb2_grpc.GeneratorStub(s.channels["generator"])


def _ret(s: Secured) -> retriever_pb2_grpc.RetrieverStub:
    return retriever_pb2_grpc.RetrieverStub(s.channels["retriever"])


def _dc(s: Secured) -> draftcache_pb2_grpc.DraftCacheStub:
    return draftcache_pb2_grpc.DraftCacheStub(s.channels["draftcache"])


DOC = retriever_pb2.Document(id="planted", title="planted", text="A document nobody may plant. " * 4)
# every RPC of the three services (Stats also over every tenant), aimed at one tenant
RPCS: dict[str, Rpc] = {
    "Generator.Answer": lambda s, t, m: collect(_gen(s).Answer(generator_pb2.AnswerRequest(
        tenant=t, question=QUESTION, params=params(max_new_tokens=MAX_NEW)), metadata=m, timeout=TIMEOUT_S)),
    "Generator.Generate": lambda s, t, m: collect(_gen(s).Generate(generator_pb2.GenerateRequest(
        tenant=t, prompt="Hello", params=params(max_new_tokens=MAX_NEW)), metadata=m, timeout=TIMEOUT_S)),
    "Retriever.Ingest": lambda s, t, m: _ret(s).Ingest(retriever_pb2.IngestRequest(tenant=t, documents=[DOC]),
                                                       metadata=m, timeout=TIMEOUT_S),
    "Retriever.Retrieve": lambda s, t, m: _ret(s).Retrieve(retriever_pb2.RetrieveRequest(
        tenant=t, question=QUESTION, tokenizer_id=s.p.generator.tokenizer_id), metadata=m, timeout=TIMEOUT_S),
    "Retriever.Stats": lambda s, t, m: _ret(s).Stats(retriever_pb2.RetrieverStatsRequest(tenant=t), metadata=m),
    "Retriever.Stats(all)": lambda s, t, m: _ret(s).Stats(retriever_pb2.RetrieverStatsRequest(), metadata=m),
    "Retriever.Delete": lambda s, t, m: _ret(s).Delete(retriever_pb2.DeleteRequest(  # the worker keeps its documents
        tenant=t, doc_ids=["json.dumps" if t == VICTIM else "no-such-doc"]), metadata=m),
    "Retriever.Forget": lambda s, t, m: _ret(s).Forget(retriever_pb2.ForgetRequest(tenant=t), metadata=m,
                                                       timeout=TIMEOUT_S),
    "DraftCache.AddOutput": lambda s, t, m: _dc(s).AddOutput(dpb.AddOutputRequest(
        tenant=t, tokenizer_id=s.p.generator.tokenizer_id, output_ids=[1, 2, 3, 4], event_id=f"planted-{t}"),
        metadata=m),
    "DraftCache.Fetch": lambda s, t, m: _dc(s).Fetch(dpb.FetchRequest(
        tenant=t, tokenizer_id=s.p.generator.tokenizer_id, prompt_ids=[11, 12], budget=8), metadata=m),
    "DraftCache.Stats": lambda s, t, m: _dc(s).Stats(dpb.DraftStatsRequest(tenant=t), metadata=m),
    "DraftCache.Stats(all)": lambda s, t, m: _dc(s).Stats(dpb.DraftStatsRequest(), metadata=m),
    "DraftCache.Snapshot": lambda s, t, m: _dc(s).Snapshot(dpb.SnapshotRequest(), metadata=m),
}
NO_TENANT = {"Retriever.Stats(all)", "DraftCache.Stats(all)", "DraftCache.Snapshot"}


def bad_credentials(s: Secured, rpc: str) -> Cases:
    """Credential class -> (metadata, the code it must get) on a call for the victim's data."""
    return shared_bad_credentials(s.tokens[VICTIM], s.tokens[WORKER], s.tokens["revoked"], rpc in NO_TENANT)


def victim_state(s: Secured) -> tuple[Any, ...]:
    """Everything a refused call could have changed about the victim."""
    snapshot = s.p.pipeline.draftcache.settings.snapshot_path()
    return (s.p.pipeline.retriever.stats(VICTIM), s.p.pipeline.draftcache.stats(VICTIM),
            len(s.p.events.for_tenant(VICTIM)), snapshot.stat().st_mtime_ns if snapshot.exists() else None)


@pytest.mark.parametrize("rpc", list(RPCS))
async def test_every_rpc_refuses_every_bad_credential_and_touches_nothing(secured: Secured, rpc: str) -> None:
    before = victim_state(secured)
    got = {}
    for case, (metadata, _) in bad_credentials(secured, rpc).items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await RPCS[rpc](secured, VICTIM, metadata)
        got[case] = err.value.code()
        # one line, never the key
        details = err.value.details() or ""
        assert "\n" not in details and secured.tokens[VICTIM] not in details, (case, details)
    # each class gets its code: UNAUTHENTICATED without a valid key, PERMISSION_DENIED for another tenant
    assert got == {case: code for case, (_, code) in bad_credentials(secured, rpc).items()}
    # the victim's documents, sessions, drafts, answers and snapshot are as they were
    assert victim_state(secured) == before


@pytest.mark.parametrize("rpc", list(RPCS))
async def test_the_right_key_works(secured: Secured, rpc: str) -> None:
    # the worker's key on the worker's data; the all-tenant calls with the admin (*) key
    token = secured.tokens["admin" if rpc in NO_TENANT else WORKER]
    reply = await RPCS[rpc](secured, WORKER, md(token))
    assert reply is not None


async def test_the_service_key_lets_the_generator_reach_the_other_two(secured: Secured) -> None:
    got = await RPCS["Generator.Answer"](secured, WORKER, md(secured.tokens[WORKER]))
    # the generator's gRPC clients sent [auth] service_key: documents and drafts came back
    assert got.final.stats.documents_available and got.final.stats.drafts_available
    assert got.final.documents
    # without it, the retriever refuses the generator's client, loudly (a set-up error, not an outage)
    with pytest.raises(FailedPrecondition, match="refused this service's credential"):
        await GrpcRetrieverClient(secured.channels["retriever"]).retrieve(
            WORKER, QUESTION, 1, 0, MAX_NEW, secured.p.generator.tokenizer_id, (), TIMEOUT_S)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await GrpcDraftCacheClient(secured.channels["draftcache"]).fetch(
            WORKER, secured.p.generator.tokenizer_id, [1, 2], [], 8, TIMEOUT_S)
    assert err.value.code() == UNAUTH


async def test_keys_cli_add_and_revoke_change_the_running_servers(secured: Secured, capsys) -> None:
    file = ["--keys-file", str(secured.keys.path)]
    assert keys_cli.main(["add", "--tenant", WORKER, "--name", "cli", *file]) == 0
    token = capsys.readouterr().out.strip()
    # a key added now works at once, on every service
    await RPCS["Retriever.Stats"](secured, WORKER, md(token))
    await RPCS["DraftCache.Fetch"](secured, WORKER, md(token))
    key_id = next(k.id for k in secured.keys.load() if k.name == "cli")
    assert keys_cli.main(["revoke", key_id, *file]) == 0
    # revoked: the next call is refused, no restart
    for rpc in ("Retriever.Stats", "DraftCache.Fetch", "Generator.Generate"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await RPCS[rpc](secured, WORKER, md(token))
        assert err.value.code() == UNAUTH, rpc


async def test_the_cases_cover_every_rpc_of_the_three_services() -> None:  # async: the module's mark
    # a new RPC must be listed here (the interceptor guards it anyway; this keeps the test honest)
    services = {"Generator": generator_pb2, "Retriever": retriever_pb2, "DraftCache": dpb}
    every = {f"{name}.{method}" for name, module in services.items()
             for method in module.DESCRIPTOR.services_by_name[name].methods_by_name}
    assert {rpc.split("(")[0] for rpc in RPCS} == every


# --- the HTTP endpoint ---------------------------------------------------------------------------------

def body() -> dict[str, Any]:
    return {"model": "", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_NEW}


async def test_http_refuses_bad_credentials_with_401_and_other_tenants_with_403(secured: Secured) -> None:
    victim = secured.tokens[VICTIM]
    cases = {  # case -> (headers, status)
        "missing": ({}, 401),
        "wrong scheme": ({"authorization": f"Basic {victim}"}, 401),
        "unknown key": ({"authorization": "Bearer lar_" + "y" * 43}, 401),
        "revoked key": ({"authorization": f"Bearer {secured.tokens['revoked']}"}, 401),
        "other tenant's key": ({"authorization": f"Bearer {secured.tokens[WORKER]}"}, 403),
    }
    before = victim_state(secured)
    async with raw_client(secured.p) as http:
        for case, (headers, status) in cases.items():
            response = await http.post("/v1/chat/completions", json=body(), headers={"x-tenant": VICTIM, **headers})
            assert response.status_code == status, (case, response.text)
            assert victim not in response.text
            if status == 401:  # RFC 6750: the scheme to use
                assert response.headers["www-authenticate"] == "Bearer", case
        # /v1/models needs a key too; /health does not
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/health")).status_code == 200
    assert victim_state(secured) == before


async def test_http_takes_the_tenant_of_a_one_tenant_key(secured: Secured) -> None:
    worker = {"authorization": f"Bearer {secured.tokens[WORKER]}"}
    async with raw_client(secured.p) as http:
        # no x-tenant header: the key's only tenant
        response = await http.post("/v1/chat/completions", json=body(), headers=worker)
        assert response.status_code == 200, response.text
        assert response.json()["documents"]
        assert (await http.get("/v1/models", headers=worker)).status_code == 200
        # a key for every tenant names no single one: the header is needed
        admin = {"authorization": f"Bearer {secured.tokens['admin']}"}
        assert (await http.post("/v1/chat/completions", json=body(), headers=admin)).status_code == 400
