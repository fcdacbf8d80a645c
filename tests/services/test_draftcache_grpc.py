"""The DraftCache service over real gRPC on loopback (port 0): calls, health, status codes, restart."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.build import build_draftcache
from lookahead_rag.services.draftcache.codec import SnapshotError
from lookahead_rag.services.draftcache.servicer import SERVICE_NAME
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.v1 import draftcache_pb2 as pb
from lookahead_rag.v1 import draftcache_pb2_grpc
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings

T = "acme"
UINT32_MAX = 2**32 - 1  # the largest id the wire can carry, past the largest token id
Stub = draftcache_pb2_grpc.DraftCacheStub
Call = Callable[[Stub, grpc.aio.Channel], Awaitable[Any]]


async def with_service(settings: DraftCacheSettings, call: Call) -> Any:
    service = await build_draftcache(settings, RequestLimits(), InProcessBus(), CollectorRegistry())
    await service.start()
    port = await service.serve(port=0)
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            return await call(Stub(channel), channel)
    finally:
        await service.stop(grace_s=1.0)


def run(settings: DraftCacheSettings, call: Call) -> Any:
    return asyncio.run(with_service(settings, call))


def add(event_id: str, ids: list[int], tenant: str = T) -> pb.AddOutputRequest:
    return pb.AddOutputRequest(tenant=tenant, tokenizer_id=TOKENIZER, output_ids=ids, event_id=event_id)


def fetch(
    prompt: list[int], tenant: str = T, budget: int = 20, refs: list[int] | None = None
) -> pb.FetchRequest:
    return pb.FetchRequest(
        tenant=tenant, tokenizer_id=TOKENIZER, prompt_ids=prompt, reference_ids=refs or [], budget=budget
    )


def continuations(response: pb.FetchResponse) -> list[tuple[list[int], float]]:
    return [(list(b.ids), b.weight) for b in response.continuations]


def test_add_fetch_stats_snapshot_and_health(tmp_path: Path) -> None:
    async def call(stub: Stub, channel: grpc.aio.Channel) -> None:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert (await stub.AddOutput(add("e1", [1, 2, 3, 4]))).applied is True
        assert (await stub.AddOutput(add("e1", [1, 2, 3, 4]))).applied is False  # idempotent
        assert (await stub.AddOutput(add("e2", [1, 2, 9], tenant="other"))).applied is True
        got = await stub.Fetch(fetch([7, 1, 2]))
        assert continuations(got) == [([1, 2, 3, 4], 1.0)]
        assert got.tokens == 4
        # unknown tenant: empty, not an error
        assert continuations(await stub.Fetch(fetch([1, 2], tenant="nobody"))) == []
        stats = await stub.Stats(pb.DraftStatsRequest(tenant=T))
        assert [(s.tenant, s.tokenizer_id, s.outputs) for s in stats.tries] == [(T, TOKENIZER, 1)]
        assert stats.tries[0].nodes > 0 and stats.tries[0].bytes > 0
        assert len((await stub.Stats(pb.DraftStatsRequest())).tries) == 2  # empty tenant: all of them
        snap = await stub.Snapshot(pb.SnapshotRequest())
        assert Path(snap.path) == tmp_path / "draftcache.snapshot"
        assert Path(snap.path).stat().st_size == snap.bytes > 0

    run(small_settings(data_dir=tmp_path), call)


BAD_REQUESTS: list[tuple[str, Call, grpc.StatusCode, str]] = [
    # empty tenant
    ("empty tenant", lambda s, _: s.Fetch(fetch([1], tenant="")), grpc.StatusCode.INVALID_ARGUMENT, "tenant"),
    # empty tokenizer id
    (
        "empty tokenizer",
        lambda s, _: s.AddOutput(pb.AddOutputRequest(tenant=T, output_ids=[1], event_id="e")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "tokenizer_id must not be empty",
    ),
    # budget over the maximum (64 in SMALL)
    ("budget", lambda s, _: s.Fetch(fetch([1], budget=65)), grpc.StatusCode.INVALID_ARGUMENT, "budget 65"),
    # too many ids (256 in SMALL)
    ("too many ids", lambda s, _: s.Fetch(fetch([1] * 257)), grpc.StatusCode.INVALID_ARGUMENT, "257 ids"),
    # a token id the wire allows (uint32) but no vocabulary has
    (
        "huge id",
        lambda s, _: s.AddOutput(add("e", [1, UINT32_MAX])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "output_ids[1] = 4294967295 is not a token id",
    ),
    # a huge id in the references
    (
        "huge ref id",
        lambda s, _: s.Fetch(fetch([1], refs=[2**31])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "reference_ids[0]",
    ),
    # Snapshot with nothing to persist to
    (
        "no data dir",
        lambda s, _: s.Snapshot(pb.SnapshotRequest()),
        grpc.StatusCode.FAILED_PRECONDITION,
        "data_dir",
    ),
]


@pytest.mark.parametrize(("name", "call", "code", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_exact_status(name: str, call: Call, code: grpc.StatusCode, message: str) -> None:
    async def attempt(stub: Stub, channel: grpc.aio.Channel) -> None:
        await stub.AddOutput(add("first", [1, 2, 3]))  # one tenant with one output
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(stub, channel)
        assert info.value.code() == code
        assert message in info.value.details()
        assert "\n" not in info.value.details()

    run(small_settings(max_tenants=1), attempt)


def test_restart_restores_the_snapshot(tmp_path: Path) -> None:
    settings = small_settings(data_dir=tmp_path, snapshot_interval_s=0)

    async def first(stub: Stub, channel: grpc.aio.Channel) -> list[tuple[list[int], float]]:
        for i, ids in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 8]]):
            await stub.AddOutput(add(f"e{i}", ids))
        return continuations(await stub.Fetch(fetch([1, 2, 3])))

    async def second(stub: Stub, channel: grpc.aio.Channel) -> list[tuple[list[int], float]]:
        assert (await stub.AddOutput(add("e0", [1, 2, 3, 4, 5]))).applied is False  # event ids came back
        return continuations(await stub.Fetch(fetch([1, 2, 3])))

    before = run(settings, first)  # stop() writes the final snapshot
    assert before == [([1, 2, 3, 4, 5], 2.0), ([1, 2, 8], 1.0)]
    assert run(settings, second) == before


def test_periodic_snapshot_writes_after_a_change(tmp_path: Path) -> None:
    settings = small_settings(data_dir=tmp_path, snapshot_interval_s=0.05)
    path = settings.snapshot_path()
    assert path is not None

    async def call(stub: Stub, channel: grpc.aio.Channel) -> None:
        await asyncio.sleep(0.2)
        assert not path.exists()  # nothing changed yet: nothing written
        await stub.AddOutput(add("e1", [1, 2, 3]))
        for _ in range(200):  # poll (up to ~10 s on a busy machine), never assert a duration
            if path.exists():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("no periodic snapshot written")

    run(settings, call)


def test_damaged_snapshot_stops_the_start(tmp_path: Path) -> None:
    settings = small_settings(data_dir=tmp_path)
    path = settings.snapshot_path()
    assert path is not None
    path.write_bytes(b"not a snapshot")

    async def never(stub: Stub, channel: grpc.aio.Channel) -> None:
        raise AssertionError("served with a damaged snapshot")

    with pytest.raises(SnapshotError, match="not a draft cache snapshot"):
        run(settings, never)
    assert path.read_bytes() == b"not a snapshot"  # left for an operator, not overwritten
