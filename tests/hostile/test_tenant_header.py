"""Issue 46, finding 5: the ``x-tenant`` routing header can be neither doubled nor, behind a tenant-routing
proxy, left out.

A proxy hashes the header to pick a tenant's replica (Envoy: every value, sorted; deploy/haproxy
refuses a second value). Both doors read one value, so a client sending its own tenant and then another's was served
while an Envoy proxy hashed both: it could steer its calls onto any replica, another tenant's included,
and read that tenant's cache timing. Without the header the proxy round-robins, which reaches every
replica the same way. Now both doors refuse more than one value with one line (gRPC INVALID_ARGUMENT,
HTTP 400), and with ``[generator] tenant_routing`` on they refuse a call without it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path

import grpc
import httpx2
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rpc.tenant_route import TENANT_METADATA, TenantRouteInterceptor
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.routes import Frontend, make_app
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.v1 import draftcache_pb2 as pb
from lookahead_rag.v1 import draftcache_pb2_grpc
from tests.builders import TOKENIZER
from tests.hostile.test_http_first import StandInGenerator
from tests.services.draftcache_helpers import small_settings

module_loop = pytest.mark.asyncio(loop_scope="module")
MINE, OTHER = "acme", "beta"
CHAT = {"model": StandInGenerator.model_name, "messages": [{"role": "user", "content": "hi"}], "rag": False}


async def door(root: Path, name: str, interceptor: TenantRouteInterceptor) -> AsyncIterator[str]:
    """A draft cache's gRPC door (no model needed) with ``interceptor`` in front: its target."""
    service = await build_draftcache(small_settings(data_dir=root / name), RequestLimits(), InProcessBus(),
                                     CollectorRegistry())
    await service.start()
    try:
        yield f"127.0.0.1:{await service.serve(port=0, interceptors=[interceptor])}"
    finally:
        await service.stop(grace_s=1.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """The routing check as shipped: the header optional."""
    async for target in door(tmp_path_factory.mktemp("plain"), "plain", TenantRouteInterceptor()):
        yield target


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def routed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """Behind a tenant-routing proxy: the header required."""
    async for target in door(tmp_path_factory.mktemp("routed"), "routed", TenantRouteInterceptor(required=True)):
        yield target


async def fetch(target: str, metadata: tuple[tuple[str, str], ...]) -> tuple[grpc.StatusCode, str]:
    """The status of a Fetch for MINE with ``metadata``, and its one-line message."""
    request = pb.FetchRequest(tenant=MINE, tokenizer_id=TOKENIZER, prompt_ids=[5, 6], budget=8)
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await draftcache_pb2_grpc.DraftCacheStub(channel).Fetch(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            details = err.details() or ""
            assert "\n" not in details
            return err.code(), details
    return grpc.StatusCode.OK, ""


@module_loop
async def test_grpc_refuses_a_doubled_header(plain: str) -> None:
    assert (await fetch(plain, ((TENANT_METADATA, MINE),)))[0] == grpc.StatusCode.OK
    for values in ((MINE, OTHER), (MINE, MINE), (OTHER, MINE)):
        code, details = await fetch(plain, tuple((TENANT_METADATA, v) for v in values))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, values
        assert TENANT_METADATA in details and "one" in details


@module_loop
async def test_grpc_behind_tenant_routing_requires_the_header(plain: str, routed: str) -> None:
    assert (await fetch(plain, ()))[0] == grpc.StatusCode.OK  # optional when routing is off
    code, details = await fetch(routed, ())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and TENANT_METADATA in details
    assert (await fetch(routed, ((TENANT_METADATA, MINE),)))[0] == grpc.StatusCode.OK
    assert (await fetch(routed, ((TENANT_METADATA, MINE),) * 2))[0] == grpc.StatusCode.INVALID_ARGUMENT


async def post(generator: StandInGenerator, headers: list[tuple[str, str]], tmp_path: Path) -> httpx2.Response:
    """One chat completion to the HTTP door over ``generator`` (no auth; a default tenant for a missing header)."""
    front = Frontend(generator, HttpSettings(default_tenant="public"))  # type: ignore[arg-type]
    front.serving = True
    transport = httpx2.ASGITransport(app=make_app(front))
    async with httpx2.AsyncClient(transport=transport, base_url="http://door") as client:
        return await client.post("/v1/chat/completions", json=CHAT, headers=headers)


@module_loop
async def test_http_refuses_a_doubled_header(tmp_path: Path) -> None:
    generator = StandInGenerator()
    assert (await post(generator, [("x-tenant", MINE)], tmp_path)).status_code == HTTPStatus.OK
    for values in ((MINE, OTHER), (MINE, MINE)):
        reply = await post(generator, [("x-tenant", v) for v in values], tmp_path)
        assert reply.status_code == HTTPStatus.BAD_REQUEST, values
        message = reply.json()["error"]["message"]
        assert "x-tenant" in message and "one" in message and "\n" not in message
    assert generator.calls == 1


@module_loop
async def test_http_behind_tenant_routing_requires_the_header(tmp_path: Path) -> None:
    assert (await post(StandInGenerator(), [], tmp_path)).status_code == HTTPStatus.OK  # the default tenant
    generator = StandInGenerator()
    generator.settings = GeneratorSettings(tenant_routing=True)  # type: ignore[misc]  # behind a hashing proxy
    reply = await post(generator, [], tmp_path)
    assert reply.status_code == HTTPStatus.BAD_REQUEST
    assert "x-tenant" in reply.json()["error"]["message"]
    assert (await post(generator, [("x-tenant", MINE)], tmp_path)).status_code == HTTPStatus.OK
    assert generator.calls == 1
