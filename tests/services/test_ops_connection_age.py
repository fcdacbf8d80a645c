"""[server] max_connection_age_s: a client connection is recycled after that long, so a dns:/// client
re-resolves and reaches replicas added since; calls keep succeeding across the recycling, and a stream
longer than the age still finishes."""

from __future__ import annotations

import asyncio

import pytest

from lookahead_rag.services.common.rpc.grpcutil import connection_age_options, open_channel
from tests.services.replica_helpers import Replica, count, replica_service, who

AGE_S = 0.3  # a connection's life in the recycling case
LOAD_S = 2.5  # how long the client keeps calling (several ages)
PAUSE_S = 0.02  # between two calls
STREAM_MESSAGES = 40  # a stream of 40 x 0.05 s = 2 s: longer than the age


def test_the_option_is_set_only_for_a_positive_age() -> None:
    # milliseconds, as gRPC's server option wants them; 0 leaves connections alone
    assert connection_age_options(300) == [("grpc.max_connection_age_ms", 300_000)]
    assert connection_age_options(0.0001) == [("grpc.max_connection_age_ms", 1)]  # never 0 (= no limit in gRPC)
    assert connection_age_options(0) == []


async def calls_for(seconds: float, replica: Replica, age_s: float) -> tuple[int, list[bytes]]:
    """Unary calls for ``seconds`` and one long stream alongside, on one channel to ``replica`` served with
    ``age_s``; returns (calls made, the stream's messages). Any failed call raises."""
    service = replica_service(replica, max_connection_age_s=age_s)
    port = await service.serve()
    channel = open_channel(f"127.0.0.1:{port}")
    try:
        stream = asyncio.create_task(_collect(count(channel)(str(STREAM_MESSAGES).encode())))
        loop = asyncio.get_running_loop()
        end, made = loop.time() + seconds, 0
        while loop.time() < end:
            assert await who(channel)(b"", timeout=5) == replica.name.encode()
            made += 1
            await asyncio.sleep(PAUSE_S)
        return made, await stream
    finally:
        await channel.close()
        await service.stop(0)


async def _collect(call: object) -> list[bytes]:
    return [message async for message in call]  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_connections_are_recycled_and_no_call_fails() -> None:
    replica = Replica("a")
    made, streamed = await calls_for(LOAD_S, replica, AGE_S)
    # the calls came over several connections (a new client port after each GOAWAY), none failed
    assert len(replica.peers) >= 2, replica.peers
    assert replica.served["Who"] == made
    # the stream outlived its connection's age and still delivered every message
    assert len(streamed) == STREAM_MESSAGES


@pytest.mark.asyncio
async def test_without_an_age_one_connection_serves_everything() -> None:
    replica = Replica("b")
    await calls_for(LOAD_S / 2, replica, 0)
    # the control: no recycling, so one client connection
    assert len(replica.peers) == 1, replica.peers
