"""Client-side load balancing and retries (services.common.rpc.channel_config): the service config built
from ``[channels]``, and real grpc.aio channels over loopback replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from lookahead_rag.services.common.auth.tls import sync_channel
from lookahead_rag.services.common.rpc.channel_config import (
    ENABLE_RETRIES_OPTION,
    SERVICE_CONFIG_OPTION,
    ChannelSettings,
    channel_options,
    service_config,
)
from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.settings import ConfigError, load_settings
from lookahead_rag.services.config import AllSettings
from tests.services.replica_helpers import SERVICE, WHO, Replica, add_replica, ipv4_target, who

CALLS = 40  # calls spread over two replicas
TIMEOUT_S = 10.0  # per call: generous on a loaded 2-core machine

pytestmark = pytest.mark.usefixtures("no_lar_env")  # LAR_CHANNELS_* of the shell would change the policy


@pytest_asyncio.fixture
async def replicas() -> AsyncIterator[tuple[list[Replica], list[int]]]:
    """Two replicas of the test service on loopback; the second fails its first call UNAVAILABLE."""
    reps = [Replica("a"), Replica("b", fail_first=1)]
    servers = [await start_server([(add_replica, rep)], [SERVICE]) for rep in reps]
    yield reps, [port for _, port in servers]
    for server, _ in servers:
        await stop_server(server, 0)


def test_service_config_from_settings() -> None:
    settings = ChannelSettings.model_construct(**ChannelSettings.model_construct().model_dump() | {
        "retry_max_attempts": 3, "retry_initial_backoff_s": 0.25, "retry_max_backoff_s": 4.0,
        "retry_backoff_multiplier": 1.5})
    config = service_config(settings)
    # round_robin over every resolved address, health-checked on the whole server ("")
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": ""}
    # one retry policy for every method: UNAVAILABLE only, the settings' attempts and backoff
    (method,) = config["methodConfig"]
    assert method["name"] == [{}]
    assert method["retryPolicy"] == {"maxAttempts": 3, "initialBackoff": "0.25s", "maxBackoff": "4s",
                                     "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]}
    # the channel options carry it as JSON and turn retries on
    options = dict(channel_options(settings))
    assert json.loads(str(options[SERVICE_CONFIG_OPTION])) == config
    assert options[ENABLE_RETRIES_OPTION] == 1


def test_service_config_without_retries_or_round_robin() -> None:
    settings = ChannelSettings.model_construct(**ChannelSettings.model_construct().model_dump() | {
        "retry_max_attempts": 1, "load_balancing": "pick_first"})
    config = service_config(settings)
    # one attempt: no retry policy at all, and retries off on the channel
    assert "methodConfig" not in config and dict(channel_options(settings))[ENABLE_RETRIES_OPTION] == 0
    # pick_first has no health checking to configure
    assert config == {"loadBalancingConfig": [{"pick_first": {}}]}


def test_channel_settings_load_from_env_and_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAR_CHANNELS_RETRY_MAX_ATTEMPTS", "2")
    # the [channels] section is part of the whole configuration, env included
    assert AllSettings.load().channels.retry_max_attempts == 2
    # gRPC caps attempts at 5: more is a one-line error naming the variable
    monkeypatch.setenv("LAR_CHANNELS_RETRY_MAX_ATTEMPTS", "9")
    with pytest.raises(ConfigError, match=r"retry_max_attempts.*LAR_CHANNELS_RETRY_MAX_ATTEMPTS"):
        load_settings(ChannelSettings, "channels")
    # a backoff cap below the first pause is refused too
    monkeypatch.delenv("LAR_CHANNELS_RETRY_MAX_ATTEMPTS")
    with pytest.raises(ConfigError, match="retry_max_backoff_s must be >= retry_initial_backoff_s"):
        load_settings(ChannelSettings, "channels", retry_max_backoff_s=0.01)


@pytest.mark.asyncio
async def test_round_robin_spreads_calls_over_both_replicas(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas
    reps[1].fail_first = 0
    async with open_channel(ipv4_target(*ports)) as channel:
        names = [await who(channel)(b"", timeout=TIMEOUT_S) for _ in range(CALLS)]
    # both replicas answered, about evenly (round_robin alternates once both are connected)
    assert set(names) == {b"a", b"b"}
    assert min(rep.served["Who"] for rep in reps) >= CALLS // 4


@pytest.mark.asyncio
async def test_pick_first_sticks_to_one_replica(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas
    reps[1].fail_first = 0
    pick_first = load_settings(ChannelSettings, "channels", load_balancing="pick_first")
    async with open_channel(ipv4_target(*ports), channels=pick_first) as channel:
        names = {await who(channel)(b"", timeout=TIMEOUT_S) for _ in range(CALLS)}
    # the contrast: without round_robin every call goes to the same replica
    assert len(names) == 1


@pytest.mark.asyncio
async def test_a_call_failing_unavailable_is_retried(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas
    async with open_channel(f"127.0.0.1:{ports[1]}") as channel:
        reply = await who(channel)(b"", timeout=TIMEOUT_S)
    # replica b failed the first attempt UNAVAILABLE; the retry got its answer
    assert reply == b"b" and reps[1].failed == 1 and reps[1].served["Who"] == 1


@pytest.mark.asyncio
async def test_without_retries_the_failure_reaches_the_caller(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas
    once = load_settings(ChannelSettings, "channels", retry_max_attempts=1)
    async with open_channel(f"127.0.0.1:{ports[1]}", channels=once) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await who(channel)(b"", timeout=TIMEOUT_S)
    # the contrast: the same failure, not retried, is the caller's
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and reps[1].served["Who"] == 0


@pytest.mark.asyncio
async def test_a_stopped_replica_is_skipped(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas
    reps[1].fail_first = 0
    async with open_channel(ipv4_target(*ports)) as channel:
        await who(channel)(b"", timeout=TIMEOUT_S)
        dead = await start_server([(add_replica, Replica("c"))], [SERVICE])
        await stop_server(dead[0], 0)
        # a target naming a replica that is gone (connection refused): every call still succeeds
        async with open_channel(ipv4_target(ports[0], dead[1])) as partial:
            names = [await who(partial)(b"", timeout=TIMEOUT_S) for _ in range(CALLS // 4)]
    assert set(names) == {b"a"}


@pytest.mark.asyncio
async def test_the_blocking_channel_balances_and_retries_too(replicas: tuple[list[Replica], list[int]]) -> None:
    reps, ports = replicas

    def calls() -> set[bytes]:
        with sync_channel(ipv4_target(*ports), None) as channel:
            call = channel.unary_unary(WHO)
            return {call(b"", timeout=TIMEOUT_S) for _ in range(CALLS // 2)}

    names = await asyncio.to_thread(calls)  # the servers run on this loop meanwhile
    # `ask` uses the blocking channel: the retry on UNAVAILABLE and round_robin apply there as well
    assert names == {b"a", b"b"} and reps[1].failed == 1
