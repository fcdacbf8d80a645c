"""Issue 22 item 8: a caller cannot put a tenant of its choice in the logs. The tenant of a gRPC call is
bound to its log lines (the access line included) only once the caller is authenticated and may use
it; with auth off it is bound as before.

The server is the draft cache (no model) with the interceptors every ``Pipeline`` server gets
(``lookahead_rag.services.common.auth.interceptor.server_interceptors``).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.interceptor import server_interceptors
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.v1 import draftcache_pb2 as pb
from lookahead_rag.v1 import draftcache_pb2_grpc
from tests.logcapture import json_lines, json_logs
from tests.services.auth_cases import md
from tests.services.draftcache_helpers import small_settings

OWN, VICTIM = "acme", "victim"
ACCESS_LOGGER = "lookahead_rag.services.common.telemetry.observability"  # one line per call: method, code, time
STATS = "/lookahead_rag.v1.DraftCache/Stats"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every log line of the test, as JSON (INFO and above), in a buffer."""
    with json_logs() as stream:
        yield stream


parsed = json_lines


async def serve(auth: Authenticator) -> AsyncIterator[str]:
    service = await build_draftcache(small_settings(), RequestLimits(), InProcessBus(), CollectorRegistry())
    await service.start()
    port = await service.serve(port=0, interceptors=server_interceptors(CollectorRegistry(), auth))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await service.stop(grace_s=1.0)


async def stats(target: str, tenant: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await draftcache_pb2_grpc.DraftCacheStub(channel).Stats(pb.DraftStatsRequest(tenant=tenant),
                                                                    metadata=metadata)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def access_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if x["logger"] == ACCESS_LOGGER and x["msg"].startswith(STATS)]


@pytest.mark.asyncio
async def test_a_refused_caller_cannot_bind_a_tenant_to_log_lines(tmp_path: Path, log_lines: io.StringIO) -> None:
    keys = KeyFile(tmp_path / "keys.json")
    _, own_key = keys.add([OWN], "acme-web")
    auth = Authenticator(AuthSettings(mode="required", keys_file=keys.path))
    async for target in serve(auth):
        # no key, an unknown key, and a real key of another tenant: all ask for the victim
        assert await stats(target, VICTIM) == grpc.StatusCode.UNAUTHENTICATED
        assert await stats(target, VICTIM, md("lar_" + "z" * 43)) == grpc.StatusCode.UNAUTHENTICATED
        assert await stats(target, VICTIM, md(own_key)) == grpc.StatusCode.PERMISSION_DENIED
        # the caller's own tenant, allowed
        assert await stats(target, OWN, md(own_key)) == grpc.StatusCode.OK
    lines = parsed(log_lines)
    assert not [x for x in lines if x["tenant"] == VICTIM], [x for x in lines if x["tenant"] == VICTIM]
    access = access_lines(lines)
    assert [x["msg"].split()[1] for x in access] == ["UNAUTHENTICATED", "UNAUTHENTICATED", "PERMISSION_DENIED", "OK"]
    assert [x["tenant"] for x in access] == [None, None, None, OWN]  # bound after authentication


@pytest.mark.asyncio
async def test_with_auth_off_the_tenant_is_bound_as_before(log_lines: io.StringIO) -> None:
    async for target in serve(Authenticator(AuthSettings())):
        assert await stats(target, OWN) == grpc.StatusCode.OK
    assert [x["tenant"] for x in access_lines(parsed(log_lines))] == [OWN]
