"""Issue 46, finding 4: one tenant can no longer take the replicas from the others at the proxy.

Under the previous proxy the only bound was per replica and absolute (16 calls in flight): a tenant holding 16 x R
streams spilled onto every replica and everyone else retried and got a 502, and below 16 nothing
spilled, so hot tenants piled onto one replica. The real proxy now (deploy/haproxy/haproxy.cfg, run
here over stand-in replicas, tests/proxy_fakes.py) holds (a) a per-tenant in-flight cap, well below a
replica's: past it the tenant is refused at once (gRPC RESOURCE_EXHAUSTED, HTTP 429 with Retry-After,
one line) while another tenant's call goes through at once; and (b) consistent hashing with bounded
loads relative to the replicas' average: a tenant stays on its hashed replica while load is even, and
spills to its next replica once that one holds more than the balance factor times the average.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from lookahead_rag.bench.haproxy_proxy import BALANCE_FACTOR, HaproxyProxy, ProxyConfig
from tests.proxy_fakes import HTTP_ROUTE, FakeReplica, fake_replicas, hold

module_loop = pytest.mark.asyncio(loop_scope="module")
CAP = 3  # PROXY_TENANT_MAX_IN_FLIGHT of the limits proxy
FACTOR = BALANCE_FACTOR  # PROXY_BALANCE_FACTOR (%): the shipped default
UNCAPPED = 1000  # the tenant cap of the bounded-loads proxy: only the balance rule acts
CANDIDATES = 40  # tenant names tried to find two homed on each replica
MAX_HOT = 8  # calls of one hot tenant before it must have spilled (the previous proxy's bound: 16)
CALL_S = 5.0  # deadline of one call's first answer
HTTP_S = 5.0  # deadline of one HTTP request
POLL_S = 0.05  # pause between two looks at the counts


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas() -> AsyncIterator[list[FakeReplica]]:
    async with fake_replicas() as fakes:
        yield fakes


@asynccontextmanager
async def proxied(fakes: list[FakeReplica], log: Path,
                  cap: int) -> AsyncIterator[tuple[HaproxyProxy, grpc.aio.Channel, list[grpc.aio.Call | None]]]:
    """The proxy over ``fakes`` with tenant routing and a cap of ``cap``, a channel to its gRPC door, and
    a list of the calls a test holds open (cancelled at the end)."""
    proxy = HaproxyProxy(ProxyConfig([f.grpc_address for f in fakes], [f.http_address for f in fakes], "tenant",
                                     tenant_max_in_flight=cap, balance_factor=FACTOR, log=log))
    await asyncio.to_thread(proxy.start)
    held: list[grpc.aio.Call | None] = []
    try:
        async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
            yield proxy, channel, held
    finally:
        await settle(proxy, fakes, held)
        proxy.stop()


def http_get(base: str, tenant: str) -> tuple[int, str, str | None]:
    """(status, body, Retry-After) of the OpenAI door's stand-in route for ``tenant``."""
    request = urllib.request.Request(base + HTTP_ROUTE, headers={"x-tenant": tenant})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_S) as reply:
            return reply.status, reply.read().decode(), reply.headers.get("retry-after")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers.get("retry-after")


async def settle(proxy: HaproxyProxy, fakes: list[FakeReplica], calls: list[grpc.aio.Call | None],
                 still_held: int = 0) -> None:
    """Cancel ``calls`` and return once the replicas and the proxy count only the ``still_held`` others."""
    for call in calls:
        if call is not None:
            call.cancel()
    calls.clear()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CALL_S
    while {sum(f.in_flight for f in fakes), sum(proxy.in_flight(f.grpc_address) for f in fakes)} != {still_held}:
        assert loop.time() < deadline, "the cancelled calls still count"
        await asyncio.sleep(POLL_S)


@module_loop
async def test_a_tenant_past_its_cap_is_refused_at_once_while_another_goes_through(
        replicas: list[FakeReplica], tmp_path: Path) -> None:
    async with proxied(replicas, tmp_path / "haproxy.log", CAP) as (proxy, channel, held):
        for _ in range(CAP):  # acme's share, every call open on some replica
            where, call = await asyncio.wait_for(hold(channel, "acme"), CALL_S)
            assert call is not None, where
            held.append(call)
        # one more: refused by the proxy, before any replica saw it, with one line
        taken = sum(f.in_flight for f in replicas)
        call = channel.unary_stream("/test.Hold/Stream")(b"hold", metadata=[("x-tenant", "acme")])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(call.read(), CALL_S)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "in-flight limit" in (refused.value.details() or "") and "\n" not in refused.value.details()
        assert sum(f.in_flight for f in replicas) == taken
        # another tenant is served at once
        where, call = await asyncio.wait_for(hold(channel, "beta"), CALL_S)
        assert where in ("r1", "r2")
        held.append(call)
        # the cap counts a tenant's calls on both doors: acme's HTTP call is refused too, beta's is not
        status, body, retry_after = await asyncio.to_thread(http_get, proxy.http_base, "acme")
        assert status == HTTPStatus.TOO_MANY_REQUESTS and retry_after is not None
        assert "in-flight limit" in body and body.count("\n") == 1
        status, body, _ = await asyncio.to_thread(http_get, proxy.http_base, "beta")
        assert status == HTTPStatus.OK and "name" in body
        # once acme's calls end, acme is served again
        await settle(proxy, replicas, held)
        where, _ = await asyncio.wait_for(hold(channel, "acme", now=True), CALL_S)
        assert where in ("r1", "r2")


async def homes(channel: grpc.aio.Channel) -> dict[str, list[str]]:
    """replica -> tenants the proxy hashes to it, each found by one short call on an idle proxy."""
    out: dict[str, list[str]] = {"r1": [], "r2": []}
    for i in range(CANDIDATES):
        where, _ = await asyncio.wait_for(hold(channel, f"tenant-{i}", now=True), CALL_S)
        out[where].append(f"tenant-{i}")
    return out


@module_loop
async def test_bounded_loads_keep_tenants_home_while_even_and_spill_past_the_factor(
        replicas: list[FakeReplica], tmp_path: Path) -> None:
    async with proxied(replicas, tmp_path / "haproxy.log", UNCAPPED) as (proxy, channel, held):
        home = await homes(channel)
        assert len(home["r1"]) >= 2 and len(home["r2"]) >= 2, home  # the hash spreads the tenants
        hot, neighbour = home["r1"][:2]
        # even load (one call on each replica): every tenant stays on its hashed replica
        for tenant, expected in ((hot, "r1"), (home["r2"][0], "r2"), (neighbour, "r1")):
            where, call = await asyncio.wait_for(hold(channel, tenant), CALL_S)
            held.append(call)
            assert where == expected, (tenant, where)  # r1 at 2 of 3 calls: within the factor
        await settle(proxy, replicas, held)
        # a hot tenant loads its replica until the bound moves its calls to the next one, long before
        # the previous proxy's fixed 16; it goes on until r1 holds two of its calls
        places: list[str] = []
        on_r2: list[grpc.aio.Call | None] = []
        while "r2" not in places or places.count("r1") < 2:
            assert len(places) < MAX_HOT, places
            where, call = await asyncio.wait_for(hold(channel, hot), CALL_S)
            places.append(where)
            (on_r2 if where == "r2" else held).append(call)
        assert places[0] == "r1", places
        await settle(proxy, replicas, on_r2, len(held))  # r1 alone loaded: above FACTOR % of the average
        loads = [proxy.in_flight(f.grpc_address) for f in replicas]
        assert loads[0] * 100 > FACTOR * sum(loads) / len(loads) and loads[1] == 0, loads
        where, call = await asyncio.wait_for(hold(channel, neighbour), CALL_S)
        held.append(call)
        assert where == "r2"  # r1's other tenant spills to its next replica
        # once r1's load falls back, the neighbour is home again
        await settle(proxy, replicas, held)
        where, _ = await asyncio.wait_for(hold(channel, neighbour, now=True), CALL_S)
        assert where == "r1"
