"""Issue 51, finding 4: nobody can lock a named tenant out at the proxy before authentication.

The proxy (deploy/haproxy/haproxy.cfg, run here over stand-in replicas, tests/proxy_fakes.py) counted
calls in flight per raw ``x-tenant`` value, while the replicas check keys only once a request's message
arrives. So HTTP/2 streams with ``x-tenant: victim``, no key and no DATA frame filled the victim's
share for up to ten minutes (``timeout client``): the victim got RESOURCE_EXHAUSTED / 429 on both
doors, and the held calls counted as load on a replica. Now (a) the count is per tenant AND per
credential presented (a hash of its ``authorization``), so a caller without the victim's key fills
only its own count; and (b) a request is forwarded only once whole (``option http-buffer-request``),
and one not whole within ``PROXY_REQUEST_TIMEOUT`` is answered there (408), so a headers-only stream
never holds a replica and never lasts past that timeout.
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

from lookahead_rag.bench.haproxy_proxy import HaproxyProxy, ProxyConfig
from tests.proxy_fakes import HOLD_METHOD, HTTP_ROUTE, FakeReplica, fake_replicas, hold
from tests.proxy_h2 import HeadersOnly

module_loop = pytest.mark.asyncio(loop_scope="module")
CAP = 3  # PROXY_TENANT_MAX_IN_FLIGHT here
VICTIM = "victim"
VICTIM_KEY = "lar_victims-own-key"  # the replicas would check it; the proxy only hashes it
WRONG_KEY = "lar_a-guess"  # what an attacker presents instead
REQUEST_TIMEOUT_S = 1.0  # PROXY_REQUEST_TIMEOUT here: short, so the test sees held streams answered
FORWARD_S = 1.0  # how long a forwarded headers-only stream takes at most to show on a replica
CALL_S = 5.0  # deadline of one call's first answer
HTTP_S = 5.0  # deadline of one HTTP request
POLL_S = 0.05  # pause between two looks
Held = list[grpc.aio.Call | None]  # calls a test holds open


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas() -> AsyncIterator[list[FakeReplica]]:
    async with fake_replicas() as fakes:
        yield fakes


@asynccontextmanager
async def proxied(fakes: list[FakeReplica], log: Path) -> AsyncIterator[tuple[HaproxyProxy, grpc.aio.Channel, Held]]:
    """The proxy over ``fakes`` (cap CAP, request timeout REQUEST_TIMEOUT_S), a channel to its gRPC door,
    and the calls a test holds open (cancelled at the end)."""
    proxy = HaproxyProxy(ProxyConfig([f.grpc_address for f in fakes], [f.http_address for f in fakes], "tenant",
                                     tenant_max_in_flight=CAP, request_timeout_s=REQUEST_TIMEOUT_S, log=log))
    await asyncio.to_thread(proxy.start)
    held: Held = []
    try:
        async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
            yield proxy, channel, held
    finally:
        for call in held:
            if call is not None:
                call.cancel()
        proxy.stop()


async def take(channel: grpc.aio.Channel, key: str | None, count: int, held: Held) -> None:
    """``count`` calls for VICTIM presenting ``key``, each taken by a replica and held open."""
    for _ in range(count):
        where, call = await asyncio.wait_for(hold(channel, VICTIM, key=key), CALL_S)
        assert where in ("r1", "r2"), (key, where)
        held.append(call)


async def refused(channel: grpc.aio.Channel, key: str | None) -> bool:
    """One more call for VICTIM presenting ``key`` is refused by the proxy's cap."""
    where, _ = await asyncio.wait_for(hold(channel, VICTIM, key=key), CALL_S)
    return where == grpc.StatusCode.RESOURCE_EXHAUSTED.name


def http_get(base: str, tenant: str, key: str) -> int:
    """The status of the OpenAI door's stand-in route for ``tenant`` with ``key``."""
    request = urllib.request.Request(base + HTTP_ROUTE,
                                     headers={"x-tenant": tenant, "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_S) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def forwarded(proxy: HaproxyProxy, fakes: list[FakeReplica], at_least: int) -> int:
    """Calls the proxy holds on the replicas, once ``at_least`` are or FORWARD_S has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FORWARD_S
    while (held := sum(proxy.in_flight(f.grpc_address) for f in fakes)) < at_least and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
    return held


@module_loop
async def test_headers_only_streams_without_the_key_cannot_take_the_victims_share(
        replicas: list[FakeReplica], tmp_path: Path) -> None:
    async with proxied(replicas, tmp_path / "haproxy.log") as (proxy, channel, held), \
            HeadersOnly(proxy.grpc_target, HOLD_METHOD) as attacker:
        # the attacker: more than the victim's share of streams, with no key and with a wrong one
        await attacker.open(CAP + 1, [("x-tenant", VICTIM)])
        await attacker.open(CAP + 1, [("x-tenant", VICTIM), ("authorization", f"Bearer {WRONG_KEY}")])
        # none of them reached a replica: a request is forwarded only once whole
        assert await forwarded(proxy, replicas, CAP) == 0
        # the victim, with its key, still has its whole share on both doors
        await take(channel, VICTIM_KEY, CAP - 1, held)
        assert await asyncio.to_thread(http_get, proxy.http_base, VICTIM, VICTIM_KEY) == HTTPStatus.OK
        await take(channel, VICTIM_KEY, 1, held)
        # and the cap still holds the victim's own calls to its share
        assert await refused(channel, VICTIM_KEY)


@module_loop
async def test_whole_calls_under_another_key_count_apart_from_the_victims(
        replicas: list[FakeReplica], tmp_path: Path) -> None:
    # calls a replica holds before it has checked their key (a stand-in here never checks one): under a
    # wrong key or none, they fill their own count, and the victim's keyed share is untouched
    async with proxied(replicas, tmp_path / "haproxy.log") as (_, channel, held):
        for key in (None, WRONG_KEY):
            await take(channel, key, CAP, held)
            assert await refused(channel, key), key  # each count is capped
        await take(channel, VICTIM_KEY, CAP, held)


@module_loop
async def test_a_stream_whose_body_never_comes_is_answered_within_the_request_timeout(
        replicas: list[FakeReplica], tmp_path: Path) -> None:
    async with proxied(replicas, tmp_path / "haproxy.log") as (proxy, _, _held), \
            HeadersOnly(proxy.grpc_target, HOLD_METHOD) as attacker:
        await attacker.open(CAP, [("x-tenant", VICTIM), ("authorization", f"Bearer {VICTIM_KEY}")])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_TIMEOUT_S + CALL_S  # the timeout, and time for the proxy to act
        while attacker.unanswered():
            assert loop.time() < deadline, f"streams {attacker.unanswered()} still held past the request timeout"
            await asyncio.sleep(POLL_S)
        assert sum(proxy.in_flight(f.grpc_address) for f in replicas) == 0
