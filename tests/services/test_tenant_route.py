"""The ``x-tenant`` routing metadata on real gRPC servers (the draft cache: no model needed): a call whose
header names its own tenant is served, one naming another tenant is PERMISSION_DENIED with one line
before it touches anything (with auth or without), and calls without it, health and all-tenant calls
are as before. The assembly (``Pipeline``) installs the check on every server it starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.interceptor import server_interceptors
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rpc.tenant_route import TenantRouteInterceptor, tenant_metadata
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.v1 import draftcache_pb2 as pb
from lookahead_rag.v1 import draftcache_pb2_grpc
from tests.builders import TOKENIZER
from tests.services.auth_cases import md
from tests.services.draftcache_helpers import small_settings

module_loop = pytest.mark.asyncio(loop_scope="module")
A, B = "acme", "beta"
IDS = [5, 6, 7, 8, 9]


@dataclass
class Servers:
    authed: str  # target of a draft cache with [auth] mode = "required"
    open: str  # target of a draft cache started by Pipeline, without auth
    tokens: dict[str, str]  # who -> API key
    store: object  # the authed server's store (nothing refused may change it)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Servers]:
    root = tmp_path_factory.mktemp("tenant-route")
    keys = KeyFile(root / "keys.json")
    tokens = {who: keys.add(tenants, who, ["admin"] if who == "admin" else ["answer", "write"])[1]
              for who, tenants in {"acme": [A], "beta": [B], "admin": ["*"]}.items()}
    registry = CollectorRegistry()
    auth = Authenticator(AuthSettings(mode="required", keys_file=keys.path))
    service = await build_draftcache(small_settings(data_dir=root / "dc"), RequestLimits(), InProcessBus(), registry)
    await service.start()
    port = await service.serve(port=0, interceptors=[*server_interceptors(registry, auth), TenantRouteInterceptor()])
    service.core.add_output(A, TOKENIZER, IDS, "seed")
    settings = AllSettings.load(None, draftcache={"data_dir": root / "p", "port": 0})
    pipeline = await Pipeline.start(settings, ["draftcache"], grpc_servers=True)
    try:
        yield Servers(f"127.0.0.1:{port}", f"127.0.0.1:{pipeline.ports['draftcache']}", tokens, service.core)
    finally:
        await pipeline.stop()
        await service.stop(grace_s=1.0)


def fetch(tenant: str = A) -> pb.FetchRequest:
    return pb.FetchRequest(tenant=tenant, tokenizer_id=TOKENIZER, prompt_ids=IDS[:2], budget=8)


async def code_of(target: str, request: pb.FetchRequest, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    """The status a Fetch with ``metadata`` ends with (OK when it is answered)."""
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await draftcache_pb2_grpc.DraftCacheStub(channel).Fetch(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            assert "\n" not in (err.details() or "")  # one line
            return err.code()
    return grpc.StatusCode.OK


@module_loop
async def test_own_tenant_header_is_served_and_another_is_denied_with_auth(servers: Servers) -> None:
    key = md(servers.tokens["acme"])
    before = servers.store.stats()  # type: ignore[attr-defined]
    assert await code_of(servers.authed, fetch(), (*key, *tenant_metadata(A))) == grpc.StatusCode.OK
    assert await code_of(servers.authed, fetch(), key) == grpc.StatusCode.OK  # the header is optional
    # acme's own key and request, but the header points at beta's replica: refused
    assert await code_of(servers.authed, fetch(), (*key, *tenant_metadata(B))) == grpc.StatusCode.PERMISSION_DENIED
    # beta's key cannot route an acme request anywhere (the auth guard refuses first)
    beta = md(servers.tokens["beta"])
    assert await code_of(servers.authed, fetch(), (*beta, *tenant_metadata(B))) == grpc.StatusCode.PERMISSION_DENIED
    assert servers.store.stats() == before  # type: ignore[attr-defined]


@module_loop
async def test_the_message_says_what_is_wrong(servers: Servers) -> None:
    async with grpc.aio.insecure_channel(servers.open) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await draftcache_pb2_grpc.DraftCacheStub(channel).Fetch(fetch(), metadata=tenant_metadata(B))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "x-tenant" in (err.value.details() or "")


@module_loop
async def test_the_pipeline_checks_the_header_without_auth(servers: Servers) -> None:
    assert await code_of(servers.open, fetch(), tenant_metadata(A)) == grpc.StatusCode.OK
    assert await code_of(servers.open, fetch(), tenant_metadata(B)) == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(servers.open, fetch(), ()) == grpc.StatusCode.OK


@module_loop
async def test_health_and_all_tenant_calls_ignore_the_header(servers: Servers) -> None:
    async with grpc.aio.insecure_channel(servers.authed) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                  metadata=tenant_metadata(B))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        admin = (*md(servers.tokens["admin"]), *tenant_metadata(B))
        stats = await draftcache_pb2_grpc.DraftCacheStub(channel).Stats(pb.DraftStatsRequest(), metadata=admin)
    assert stats is not None
