"""Two real generator replicas (processes) behind the real proxy (deploy/haproxy/haproxy.cfg, tenant routing),
a shared draft cache and Kafka; one replica is SIGKILLed while it has requests in flight.

What must hold: no request that had not streamed a token fails (the client sends it again, the proxy
takes it to the replica left); every answer a client received was published exactly once (outbox +
Kafka: the dead replica's outbox drains when it comes back on its own data directory); the shared draft
cache applied each event once; and the dead replica's tenants are served again (warm caches) on their
new home. Skips with the reason when haproxy (tests/proxy_fakes.py: required under LAR_PROXY_TESTS=required)
or the tansu broker is missing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from lookahead_rag.bench.haproxy_proxy import HaproxyProxy, ProxyConfig
from lookahead_rag.bench.replica_set import ReplicaConfig, ReplicaSet
from lookahead_rag.bench.serve_client import one_request
from lookahead_rag.bench.serve_load import ReplayPrompt
from lookahead_rag.bench.serve_stats import RequestRecord
from lookahead_rag.services.events.kafka.broker import LocalBroker, ensure_topics
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.topics import all_topics
from lookahead_rag.v1 import draftcache_pb2, draftcache_pb2_grpc, events_pb2, generator_pb2_grpc
from tests.kafka.helpers import require_tansu
from tests.proxy_fakes import require_haproxy

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

TENANTS = 8  # spread over both replicas by the proxy's hash
REQUESTS = 12  # sent by CLIENTS closed-loop clients
CLIENTS = 4
NEW_TOKENS = 8  # per answer
WARM_TOKENS = 1  # per answer once only the prefix cache is looked at (its hits are known after prefill)
ATTEMPTS = 3  # sends of a request that fails before its first token
KILL_AFTER = 3  # answers completed before the kill
WAIT_S = 60.0  # longest wait for the events to arrive
POLL_S = 0.1


def prompt(i: int) -> ReplayPrompt:
    """Request i: its tenant's shared head (what the replica's prefix cache keeps) and a tail of its own."""
    tenant = i % TENANTS
    return ReplayPrompt(f"tenant-{tenant}", (*range(200 + tenant, 260 + tenant), 1000 + i))


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReplicaSet, HaproxyProxy, str]]:
    require_haproxy()
    binary = require_tansu()
    root = tmp_path_factory.mktemp("replica-faults")
    with LocalBroker(binary=binary, log_path=root / "tansu.log") as broker:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap)
        asyncio.run(ensure_topics(broker.bootstrap, all_topics(settings)))
        cfg = ReplicaConfig(root, replicas=2, threads=1, kafka=broker.bootstrap,
                            generator={"calibrate_kernels": "false"},
                            limits={"default_max_new_tokens": str(NEW_TOKENS)})
        with ReplicaSet(cfg) as replicas, HaproxyProxy(ProxyConfig(
                replicas.grpc_upstreams(), replicas.http_upstreams(), "tenant", log=root / "haproxy.log")) as proxy:
            yield replicas, proxy, broker.bootstrap


async def load_and_kill(replicas: ReplicaSet, proxy: HaproxyProxy) -> tuple[list[RequestRecord], int]:
    """Send every request; once KILL_AFTER have answered, SIGKILL the replica with the most in flight.
    Returns the records and the killed replica's index."""
    records: list[RequestRecord] = []
    todo = iter(range(REQUESTS))
    async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
        stub = generator_pb2_grpc.GeneratorStub(channel)

        async def client() -> None:
            for i in todo:
                records.append(await one_request(stub, i, prompt(i), "", NEW_TOKENS, WAIT_S, attempts=ATTEMPTS))

        clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
        while True:  # the kill: mid-load, on a replica that holds requests now
            if all(c.done() for c in clients):
                pytest.fail("every request ended before the kill: nothing was in flight to lose")
            loads = [proxy.in_flight(a) for a in replicas.grpc_upstreams()]
            if len(records) >= KILL_AFTER and max(loads) > 0:
                break
            await asyncio.sleep(POLL_S)
        victim = loads.index(max(loads))
        await asyncio.to_thread(replicas.kill, victim)
        await asyncio.gather(*clients)
    return sorted(records, key=lambda r: r.index), victim


async def published(bootstrap: str, topic: str, at_least: int) -> list[events_pb2.GenerationCompleted]:
    """Every event on the topic, once at least ``at_least`` have arrived (then: up to its end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20)
    await consumer.start()
    try:
        await consumer.topics()  # fetches the metadata
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        await consumer.seek_to_beginning()
        events: list[events_pb2.GenerationCompleted] = []
        async with asyncio.timeout(WAIT_S):
            while len(events) < at_least or sum((await consumer.end_offsets(parts)).values()) > len(events):
                for batch in (await consumer.getmany(timeout_ms=100)).values():
                    events += [events_pb2.GenerationCompleted.FromString(r.value) for r in batch]
        return events
    finally:
        await consumer.stop()


async def applied_outputs(target: str, at_least: int) -> int:
    """The draft cache's outputs over every tenant, once at least ``at_least`` (or the wait ran out)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = draftcache_pb2_grpc.DraftCacheStub(channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            stats = await stub.Stats(draftcache_pb2.DraftStatsRequest())
            total = sum(t.outputs for t in stats.tries)
            if total >= at_least or loop.time() > deadline:
                return total
            await asyncio.sleep(POLL_S)


def test_a_replica_killed_mid_load_loses_no_request_and_no_event(
        proxied: tuple[ReplicaSet, HaproxyProxy, str]) -> None:
    replicas, proxy, bootstrap = proxied
    records, victim = asyncio.run(load_and_kill(replicas, proxy))
    # no request failed before its first token: only streams cut mid-way (they had tokens) may fail
    lost = [(r.index, r.error, r.retries) for r in records if not r.completed and not r.deltas]
    assert lost == []
    assert sum(r.completed for r in records) >= REQUESTS - CLIENTS  # at most one cut stream per client
    # the killed replica comes back on its own data directory: its outbox drains what it had not sent
    proxy.wait_unhealthy(replicas.grpc_upstreams()[victim])  # its health checks take it out (1 s apart)
    replicas.restart(victim)
    answered = {r.request_id for r in records if r.completed}
    events = asyncio.run(published(bootstrap, KafkaSettings().topic, len(answered)))
    ids = Counter(e.request_id for e in events)
    assert answered <= set(ids)  # no answer's event lost
    assert [rid for rid, n in ids.items() if n > 1] == []  # none published twice
    cut = {r.request_id for r in records if not r.completed}
    assert set(ids) - answered <= cut  # an event beyond the answers: only a stream cut after its publish
    # the shared draft cache applied each event exactly once
    assert asyncio.run(applied_outputs(replicas.draftcache_target(), len(ids))) == len(ids)


def test_after_the_kill_and_the_restart_each_tenant_stays_on_one_replica_and_each_reports_its_load(
        proxied: tuple[ReplicaSet, HaproxyProxy, str]) -> None:
    replicas, proxy, _ = proxied
    proxy.wait_healthy()  # the restarted replica is back in the proxy's pool: its tenants go home

    # every tenant in turn, then every tenant again, one call at a time: with no other load the bounded
    # loads never move a call, so each lands on its tenant's hashed replica (a burst of calls would let
    # the proxy spill some, as it should, to the other replica, cold)
    async def twice() -> list[RequestRecord]:
        async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
            stub = generator_pb2_grpc.GeneratorStub(channel)
            return [await one_request(stub, i, prompt(i), "", WARM_TOKENS, WAIT_S, attempts=ATTEMPTS)
                    for _ in range(2) for i in range(TENANTS)]

    records = asyncio.run(twice())
    assert all(r.completed for r in records)
    # every replica reports its load (running, waiting, KV bytes) where an operator can read it
    assert all(set(replicas.load(i)) == {"running", "waiting", "kv_bytes"} for i in range(len(replicas.generators)))
    # every tenant's second request reuses the prefix KV its first one left on the same replica
    assert [r.index for r in records[TENANTS:] if r.stats is None or r.stats.prefix_hit_tokens == 0] == []
