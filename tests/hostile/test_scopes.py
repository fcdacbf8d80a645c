"""Issue 22 item 5: a key does what its scopes say, and no more. A web frontend's key (``answer``) asks;
it cannot Ingest, Delete, Forget or AddOutput; a ``write`` key changes data but cannot ask; ``admin``
does everything for every tenant. Every RPC and every HTTP route declares its scope in one table
(``lookahead_rag.services.common.auth.scopes``); a call of no declared scope is refused. Keys and certificate subjects
written before scopes existed keep working.

The pipeline here requires keys (``[auth] mode = "required"``); its generator reaches the other two
with a service key of scope ``answer`` for every tenant (``*``), what ``keys add --all-tenants`` makes.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lookahead_rag import v1 as protos
from lookahead_rag.services import keys_cli
from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.interceptor import server_interceptors
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.scopes import GRPC_SCOPES, HTTP_SCOPES, Scope, grpc_scope, http_scope
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rpc.grpcutil import start_server, stop_server
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.v1 import draftcache_pb2 as dpb
from lookahead_rag.v1 import draftcache_pb2_grpc, generator_pb2, generator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from tests.http.helpers import raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, collect, module_loop, params, running_pipeline
from tests.services.auth_cases import md

TENANT, OTHER = "scoped", "scoped-other"
MAX_NEW = 4
TIMEOUT_S = 300.0
SERVICES = ("generator", "retriever", "draftcache")
DENIED = grpc.StatusCode.PERMISSION_DENIED


# ---- the one table covers everything served ------------------------------------------------------------

def served_methods() -> set[str]:
    """``/package.Service/Method`` of every method of every service in the generated protos."""
    methods = set()
    for info in pkgutil.iter_modules(protos.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"{protos.__name__}.{info.name}")
            for service in module.DESCRIPTOR.services_by_name.values():
                methods |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    return methods


def test_every_rpc_of_every_service_declares_a_scope() -> None:
    methods = served_methods()
    assert len(methods) >= len(GRPC_SCOPES) > 0
    assert {m for m in methods if grpc_scope(m) is None} == set()  # a new RPC must be declared
    assert set(GRPC_SCOPES) <= methods  # and the table names no RPC that is gone
    assert grpc_scope("/grpc.health.v1.Health/Check") is Scope.OPEN
    assert grpc_scope("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is Scope.OPEN


class _NoEngine:
    model_name = "none"
    limits = RequestLimits()


def test_every_http_route_declares_a_scope() -> None:
    app = make_app(Frontend(_NoEngine(), HttpSettings(docs=True)))  # type: ignore[arg-type]  # every route
    routes = {(method, route.path) for route in app.routes for method in getattr(route, "methods", None) or ()}
    assert routes, "no routes found"
    assert {r for r in routes if http_scope(*r) is None} == set()  # a new route must be declared
    assert {(m, p) for m, p in HTTP_SCOPES} <= {(m, p) for m, p in routes}
    assert http_scope("POST", "/v1/chat/completions") is Scope.ANSWER and http_scope("GET", "/health") is Scope.OPEN


@pytest.mark.asyncio
async def test_a_method_of_no_declared_scope_is_refused_even_to_an_admin(tmp_path: Path) -> None:
    keys = KeyFile(tmp_path / "keys.json")
    _, admin = keys.add(["*"], "ops", ["admin"])
    auth = Authenticator(AuthSettings(mode="required", keys_file=keys.path))
    undeclared = "/lookahead_rag.v1.Retriever/Undeclared"
    assert grpc_scope(undeclared) is None
    handler = grpc.method_handlers_generic_handler(
        "lookahead_rag.v1.Retriever", {"Undeclared": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"served")})
    server, port = await start_server([(lambda _, srv: srv.add_generic_rpc_handlers((handler,)), None)], [],
                                      interceptors=server_interceptors(CollectorRegistry(), auth))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary(undeclared)(b"", metadata=md(admin))
            assert err.value.code() == DENIED and "no declared scope" in (err.value.details() or "")
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING  # open, no credential
    finally:
        await stop_server(server, 0)


# ---- keys and subjects ----------------------------------------------------------------------------------

def test_keys_add_takes_scopes_and_defaults_to_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = KeyFile(tmp_path / "keys.json")
    file = ["--keys-file", str(keys.path)]
    assert keys_cli.main(["add", "--tenant", "acme", "--name", "web", *file]) == 0
    assert keys_cli.main(["add", "--tenant", "acme", "--scope", "answer,write", "--scope", "write", "--name", "both",
                          *file]) == 0
    assert keys_cli.main(["add", "--scope", "admin", "--name", "ops", *file]) == 0  # admin: every tenant
    capsys.readouterr()
    got = {k.name: (k.tenants, {s.value for s in k.scopes}) for k in keys.load()}
    assert got == {"web": (("acme",), {"answer"}), "both": (("acme",), {"answer", "write"}),
                   "ops": (("*",), {"admin"})}
    assert keys_cli.main(["list", *file]) == 0
    assert "answer,write" in capsys.readouterr().out
    for bad in (["--tenant", "acme", "--scope", "root"], ["--tenant", "acme", "--scope", "admin"], []):
        assert keys_cli.main(["add", *bad, *file]) == keys_cli.EXIT_ERROR, bad
        err = capsys.readouterr().err.strip()
        assert err and "\n" not in err, bad


def test_credentials_written_before_scopes_keep_working(tmp_path: Path) -> None:
    keys = KeyFile(tmp_path / "keys.json")
    _, tenant_key = keys.add(["acme"], "old-web")
    _, star_key = keys.add(["*"], "old-ops")
    doc = json.loads(keys.path.read_text())
    for record in doc["keys"]:
        del record["scopes"]  # as the file was written before scopes
    keys.path.write_text(json.dumps(doc))
    subjects: dict[str, Any] = {"old-batch": ["acme"], "old-ops": ["*"], "new-web": {"tenants": ["acme"]},
                                "new-sync": {"tenants": ["acme"], "scopes": ["write"]}}
    auth = Authenticator(AuthSettings(mode="required", keys_file=keys.path, cert_subjects=subjects))
    old_web, old_ops = auth.authenticate(f"Bearer {tenant_key}"), auth.authenticate(f"Bearer {star_key}")
    assert old_web.scopes == {Scope.ANSWER, Scope.WRITE} and old_ops.scopes == {Scope.ADMIN}
    assert auth.authenticate(None, "old-batch").scopes == {Scope.ANSWER, Scope.WRITE}
    assert auth.authenticate(None, "old-ops").admin
    assert auth.authenticate(None, "new-web").scopes == {Scope.ANSWER}  # a new subject's default
    assert auth.authenticate(None, "new-sync").scopes == {Scope.WRITE}
    # and they are checked: an old one-tenant key may not Snapshot
    with pytest.raises(Exception, match="lacks the 'admin' scope"):
        auth.check(f"Bearer {tenant_key}", None, "", grpc_scope("/lookahead_rag.v1.DraftCache/Snapshot"), "Snapshot")


# ---- on the pipeline -----------------------------------------------------------------------------------

@dataclass
class Secured:
    p: RunningPipeline
    tokens: dict[str, str]  # who -> key
    channels: dict[str, grpc.aio.Channel]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    root = tmp_path_factory.mktemp("scopes")
    keys = KeyFile(root / "keys.json")
    _, service_key = keys.add(["*"], "services")  # the default scope: answer
    tokens = {"web": keys.add([TENANT], "web")[1],  # a frontend's key: answer
              "sync": keys.add([TENANT], "sync", ["write"])[1],  # a document sync job's: write
              "ops": keys.add(["*"], "ops", ["admin"])[1]}
    auth = {"mode": "required", "keys_file": keys.path, "service_key": service_key}
    async with running_pipeline(root, auth=auth) as p:
        p.ingest(TENANT)
        p.ingest(OTHER)
        channels = {name: grpc.aio.insecure_channel(p.target(name)) for name in SERVICES}
        try:
            yield Secured(p, tokens, channels)
        finally:
            for channel in channels.values():
                await channel.close()


Rpc = Callable[[Secured, str, Any], Awaitable[Any]]
DOC = retriever_pb2.Document(id="planted", title="planted", text="A document only a writer may add. " * 4)


def _ret(s: Secured) -> retriever_pb2_grpc.RetrieverStub:
    return retriever_pb2_grpc.RetrieverStub(s.channels["retriever"])


def _dc(s: Secured) -> draftcache_pb2_grpc.DraftCacheStub:
    return draftcache_pb2_grpc.DraftCacheStub(s.channels["draftcache"])


WRITES: dict[str, Rpc] = {
    "Ingest": lambda s, t, m: _ret(s).Ingest(retriever_pb2.IngestRequest(tenant=t, documents=[DOC]), metadata=m,
                                             timeout=TIMEOUT_S),
    "Delete": lambda s, t, m: _ret(s).Delete(retriever_pb2.DeleteRequest(tenant=t, doc_ids=["no-such-doc"]),
                                             metadata=m),
    "Forget": lambda s, t, m: _ret(s).Forget(retriever_pb2.ForgetRequest(tenant=t, doc_id="no-such-doc"), metadata=m,
                                             timeout=TIMEOUT_S),
    "AddOutput": lambda s, t, m: _dc(s).AddOutput(dpb.AddOutputRequest(
        tenant=t, tokenizer_id=s.p.generator.tokenizer_id, output_ids=[1, 2, 3, 4], event_id=f"planted-{len(m)}"),
        metadata=m),
}
ASKS: dict[str, Rpc] = {
    "Answer": lambda s, t, m: collect(generator_pb2_grpc.GeneratorStub(s.channels["generator"]).Answer(
        generator_pb2.AnswerRequest(tenant=t, question=QUESTION, params=params(max_new_tokens=MAX_NEW)), metadata=m,
        timeout=TIMEOUT_S)),
    "Retrieve": lambda s, t, m: _ret(s).Retrieve(retriever_pb2.RetrieveRequest(
        tenant=t, question=QUESTION, tokenizer_id=s.p.generator.tokenizer_id), metadata=m, timeout=TIMEOUT_S),
    "Fetch": lambda s, t, m: _dc(s).Fetch(dpb.FetchRequest(
        tenant=t, tokenizer_id=s.p.generator.tokenizer_id, prompt_ids=[11, 12], budget=8), metadata=m),
    "Stats": lambda s, t, m: _ret(s).Stats(retriever_pb2.RetrieverStatsRequest(tenant=t), metadata=m),
}
SNAPSHOT: Rpc = lambda s, t, m: _dc(s).Snapshot(dpb.SnapshotRequest(), metadata=m)  # noqa: E731


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        assert "\n" not in (err.details() or "")  # one line
        return err.code()
    return grpc.StatusCode.OK


def tenant_data(s: Secured) -> tuple[Any, ...]:
    return s.p.pipeline.retriever.stats(TENANT), s.p.pipeline.draftcache.stats(TENANT)


@module_loop
async def test_a_frontend_key_asks_but_cannot_write(secured: Secured) -> None:
    web = md(secured.tokens["web"])
    before = tenant_data(secured)
    writes = {rpc: await code_of(call(secured, TENANT, web)) for rpc, call in WRITES.items()}
    assert writes == dict.fromkeys(WRITES, DENIED)
    assert await code_of(SNAPSHOT(secured, "", web)) == DENIED
    assert tenant_data(secured) == before  # nothing planted, nothing forgotten
    asks = {rpc: await code_of(call(secured, TENANT, web)) for rpc, call in ASKS.items()}
    assert asks == dict.fromkeys(ASKS, grpc.StatusCode.OK)


@module_loop
async def test_a_write_key_writes_but_cannot_ask(secured: Secured) -> None:
    sync = md(secured.tokens["sync"])
    asks = {rpc: await code_of(call(secured, TENANT, sync)) for rpc, call in ASKS.items()}
    assert asks == dict.fromkeys(ASKS, DENIED)
    writes = {rpc: await code_of(call(secured, TENANT, sync)) for rpc, call in WRITES.items()}
    assert writes == dict.fromkeys(WRITES, grpc.StatusCode.OK)
    assert await code_of(WRITES["Ingest"](secured, OTHER, sync)) == DENIED  # still its own tenant only
    assert await code_of(SNAPSHOT(secured, "", sync)) == DENIED


@module_loop
async def test_admin_does_everything_for_every_tenant(secured: Secured) -> None:
    ops = md(secured.tokens["ops"])
    assert await code_of(SNAPSHOT(secured, "", ops)) == grpc.StatusCode.OK
    for tenant in (TENANT, OTHER):
        assert await code_of(ASKS["Stats"](secured, tenant, ops)) == grpc.StatusCode.OK
        assert await code_of(WRITES["Delete"](secured, tenant, ops)) == grpc.StatusCode.OK
    assert await code_of(ASKS["Stats"](secured, "", ops)) == grpc.StatusCode.OK  # across every tenant


@module_loop
async def test_the_answer_scope_service_key_lets_the_generator_reach_the_other_two(secured: Secured) -> None:
    got = await ASKS["Answer"](secured, TENANT, md(secured.tokens["web"]))
    assert got.final.stats.documents_available and got.final.stats.drafts_available and got.final.documents


@module_loop
async def test_http_routes_need_their_scope(secured: Secured) -> None:
    chat = {"model": "", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_NEW}
    async with raw_client(secured.p) as http:
        sync = {"authorization": f"Bearer {secured.tokens['sync']}"}
        for response in (await http.post("/v1/chat/completions", json=chat, headers=sync),
                         await http.get("/v1/models", headers=sync)):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["type"] == "permission_error"
        web = {"authorization": f"Bearer {secured.tokens['web']}"}
        assert (await http.get("/v1/models", headers=web)).status_code == 200
        assert (await http.post("/v1/chat/completions", json=chat, headers=web)).status_code == 200
