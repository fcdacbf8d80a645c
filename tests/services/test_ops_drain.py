"""Graceful rollout: a replica stopped the way SIGTERM stops it (services.common.service.graceful_stop)
drains first (health NOT_SERVING, calls still served), then refuses new calls and lets in-flight
ones finish; clients balancing over the replicas with retries see no failed call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_draining
from lookahead_rag.services.common.service import Service, graceful_stop
from tests.services.replica_helpers import Replica, count, ipv4_target, replica_service, who

DRAIN_S = 1.0  # the stopped replica keeps serving this long after its health goes NOT_SERVING
GRACE_S = 5.0  # then in-flight calls get this long
STREAM_MESSAGES = 40  # the in-flight stream on the stopped replica: 40 x 50 ms, past the drain
WORKERS = 4  # concurrent callers in the load loop
TIMEOUT_S = 10.0  # per call: generous on a loaded 2-core machine
SETTLE_S = 0.5  # after this much of the drain the balancer has moved away from the draining replica
LOAD_BEFORE_S = 0.5  # load before the stop starts
LOAD_AFTER_S = 0.5  # load after the stopped replica is gone

pytestmark = [pytest.mark.usefixtures("no_lar_env"), pytest.mark.asyncio]

Answer = tuple[float, bytes]  # (when the call started, the replica that answered)


async def health_of(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
    return int(reply.status)


async def direct_who(port: int) -> bytes:
    """A call straight to one replica (no balancing, no retry)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return bytes(await who(channel)(b"", timeout=TIMEOUT_S))


async def read_rest(stream: grpc.aio.UnaryStreamCall) -> list[bytes]:
    """The stream's remaining messages, up to its end."""
    out = []
    while (message := await stream.read()) is not grpc.aio.EOF:
        out.append(bytes(message))
    return out


@pytest_asyncio.fixture
async def services() -> AsyncIterator[list[Service[Replica]]]:
    """Two replicas (not yet serving) with a drain and a grace; whatever still serves is stopped at the end."""
    made = [replica_service(Replica(name), drain_s=DRAIN_S, shutdown_grace_s=GRACE_S) for name in ("a", "b")]
    yield made
    for service in made:
        await service.stop(grace_s=0)


async def test_a_replica_stopped_under_load_fails_no_call(services: list[Service[Replica]]) -> None:
    ports = [await service.serve() for service in services]
    stopping = services[0]
    answers: list[Answer] = []
    errors: list[BaseException] = []
    done = asyncio.Event()

    async def caller(channel: grpc.aio.Channel) -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                answers.append((started, bytes(await who(channel)(b"", timeout=TIMEOUT_S))))
            except grpc.aio.AioRpcError as err:
                errors.append(err)

    async with open_channel(ipv4_target(*ports)) as channel, \
            grpc.aio.insecure_channel(f"127.0.0.1:{ports[0]}") as direct:
        stream = count(direct)(str(STREAM_MESSAGES).encode(), timeout=TIMEOUT_S)
        first = await stream.read()  # the stream is in flight on the replica about to stop
        workers = [asyncio.create_task(caller(channel)) for _ in range(WORKERS)]
        await asyncio.sleep(LOAD_BEFORE_S)
        drain_started = time.monotonic()
        stop = asyncio.create_task(graceful_stop([stopping], stopping.stop))
        await asyncio.sleep(SETTLE_S)
        # draining: health says NOT_SERVING, yet a call that still arrives is served
        assert await health_of(ports[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await direct_who(ports[0]) == b"a"
        rest = await read_rest(stream)
        await stop
        stopped = time.monotonic()
        await asyncio.sleep(LOAD_AFTER_S)
        done.set()
        await asyncio.gather(*workers)
        stream_status = await stream.code()

    # no call of the load failed, and both replicas took their share before the stop
    assert errors == []
    assert {name for when, name in answers if when < drain_started} == {b"a", b"b"}
    # once the drain had settled, the health-checking balancer sent every call to the other replica
    late = [name for when, name in answers if drain_started + SETTLE_S <= when]
    assert late and set(late) == {b"b"}
    # the in-flight stream on the stopped replica finished whole, within drain + grace
    assert [first, *rest] == [f"a:{i}".encode() for i in range(STREAM_MESSAGES)]
    assert stream_status == grpc.StatusCode.OK and stopping.core.served["Count"] == 1
    # the stop waited out the drain before refusing new calls
    assert stopped - drain_started >= DRAIN_S


async def test_after_the_drain_new_calls_are_refused(services: list[Service[Replica]]) -> None:
    stopping = services[0]
    port = await stopping.serve()
    await stopping.start_draining()
    # draining: NOT_SERVING but still answering
    assert await health_of(port) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await direct_who(port) == b"a"
    await stopping.stop()
    # stopped: a new call finds nobody (the balancer's retry would send it to another replica)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await direct_who(port)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stop_waits_only_what_is_left_of_the_drain(services: list[Service[Replica]]) -> None:
    stopping = services[0]
    await stopping.serve()
    assert stopping.server is not None
    await start_draining(stopping.server)
    await asyncio.sleep(DRAIN_S)
    started = time.monotonic()
    await stopping.stop()
    # the drain already elapsed (graceful_stop's drain phase): stopping adds no second wait
    assert time.monotonic() - started < DRAIN_S / 2
