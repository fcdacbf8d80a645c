"""The tenant-routing proxy configurations in deploy/: the HAProxy file the tests and the benchmark run
(haproxy -c accepts it for both routings; it hashes on the same header our clients send; its gRPC health
check, HTTP/2 spoken byte by byte, is the length-prefixed empty HealthCheckRequest and passes on SERVING
only, and a draining replica leaves the pool) and the Kubernetes Gateway API manifests
(deploy/k8s/routing: the routes reach the generator Service's ports, every policy hashes on x-tenant and
targets a route that exists, the kustomization lists every file)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2

from lookahead_rag.bench.haproxy_proxy import HAPROXY_CFG, HaproxyProxy, ProxyConfig, haproxy_binary, proxy_env
from lookahead_rag.services.common.ports import GRPC_PORTS, HTTP_PORT
from lookahead_rag.services.common.rpc.tenant_route import TENANT_METADATA
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.v1 import generator_pb2
from tests.proxy_fakes import HTTP_ROUTE, FakeReplica, hold, require_haproxy

ROUTING = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "routing"
GENERATOR_SERVICE = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # HTTP/2's client connection preface
SETTINGS, HEADERS, DATA = 4, 1, 0  # HTTP/2 frame types
END_STREAM, END_HEADERS = 1, 4  # HTTP/2 frame flags
FRAME_HEADER = 9  # bytes before an HTTP/2 frame's payload
CALLS = 4  # calls sent after a replica drained
CALL_S = 5.0  # deadline of one call's first answer
TENANTS = 12  # tenants whose replica is looked up on both doors
ASK_AGAIN = 3  # where the doors differ: asks of both again, once the proxy is idle (a closing call spills loads)
IDLE_S = 0.3  # the wait before asking again


def grpc_frame(message: Any) -> bytes:
    """A gRPC message on the wire: uncompressed flag, 4-byte big-endian length, the bytes."""
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def checked(routing: str) -> subprocess.CompletedProcess[str]:
    """haproxy -c on the shipped file for two upstreams and ``routing``."""
    require_haproxy()
    cfg = ProxyConfig(["10.0.0.1:50053", "10.0.0.2:50053"], ["10.0.0.1:8080", "10.0.0.2:8080"], routing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")} | proxy_env(cfg, 50050, 8088, 8404)
    return subprocess.run([str(haproxy_binary()), "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("routing", ["tenant", "round_robin"])
def test_haproxy_accepts_the_file_for_both_routings(routing: str) -> None:
    out = checked(routing)
    assert out.returncode == 0, out.stdout + out.stderr


def test_haproxy_hashes_each_door_on_the_clients_tenant_header_with_bounded_loads() -> None:
    text = HAPROXY_CFG.read_text()
    hashed = re.findall(r"^\s*balance hdr\(([^)]+)\)$", text, re.M)
    assert hashed == [TENANT_METADATA] * 2 and HttpSettings().tenant_header == TENANT_METADATA
    assert len(re.findall(r"^\s*hash-balance-factor ", text, re.M)) == 2  # bounded loads on both doors
    # the per-tenant count, per credential presented: (hash of authorization, x-tenant), on both doors
    assert len(re.findall(r"set-var\(txn\.slot\) var\(txn\.caller\),concat\(/,txn\.tenant\)", text)) == 2
    assert len(re.findall(r"track-sc0 var\(txn\.slot\)", text)) == 2


def frames(raw: bytes) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of each HTTP/2 frame in ``raw``."""
    out = []
    while raw:
        size = int.from_bytes(raw[:3], "big")
        out.append((raw[3], raw[4], raw[FRAME_HEADER:FRAME_HEADER + size]))
        raw = raw[FRAME_HEADER + size:]
    return out


def test_haproxy_speaks_a_grpc_health_check_and_only_serving_passes() -> None:
    text = HAPROXY_CFG.read_text()
    sent = bytes.fromhex(re.search(r"tcp-check send-binary ([0-9a-f]+)", text).group(1))  # type: ignore[union-attr]
    assert sent.startswith(PREFACE)
    (settings, _, _), (headers, header_flags, block), (data, data_flags, body) = frames(sent[len(PREFACE):])
    assert (settings, headers, data) == (SETTINGS, HEADERS, DATA)
    assert header_flags & END_HEADERS and data_flags & END_STREAM
    for literal in (b"/grpc.health.v1.Health/Check", b"application/grpc", b"te", b"trailers"):
        assert literal in block
    assert body == grpc_frame(health_pb2.HealthCheckRequest())  # an empty request, length-prefixed
    expect = bytes.fromhex(re.search(r"tcp-check expect binary ([0-9a-f]+)", text).group(1))  # type: ignore[union-attr]
    status = health_pb2.HealthCheckResponse
    assert expect == grpc_frame(status(status=status.SERVING))
    for other in (status.NOT_SERVING, status.UNKNOWN, status.SERVICE_UNKNOWN):
        assert expect not in grpc_frame(status(status=other))


@asynccontextmanager
async def fakes_behind_the_proxy(tmp_path: Path, routing: str) -> AsyncIterator[tuple[list[FakeReplica], HaproxyProxy]]:
    """Two stand-in replicas and the shipped proxy over them, every replica through its health checks."""
    require_haproxy()
    fakes = [FakeReplica("r1"), FakeReplica("r2")]
    for fake in fakes:
        await fake.start()
    proxy = HaproxyProxy(ProxyConfig([f.grpc_address for f in fakes], [f.http_address for f in fakes],
                                     routing, log=tmp_path / "haproxy.log"))
    try:
        await asyncio.to_thread(proxy.start)
        yield fakes, proxy
    finally:
        proxy.stop()
        for fake in fakes:
            await fake.stop()


@pytest.mark.asyncio
async def test_a_draining_replica_leaves_the_pool_and_the_other_takes_its_calls(tmp_path: Path) -> None:
    async with fakes_behind_the_proxy(tmp_path, "round_robin") as (fakes, proxy):
        await fakes[0].drain()  # NOT_SERVING, still serving: the proxy's next check takes it out
        await asyncio.to_thread(proxy.wait_unhealthy, fakes[0].grpc_address)
        async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
            places = [(await asyncio.wait_for(hold(channel, f"t{i}", now=True), CALL_S))[0] for i in range(CALLS)]
        assert places == ["r2"] * CALLS


def http_replica(base: str, tenant: str) -> str:
    """The stand-in replica the OpenAI door sends ``tenant`` to."""
    request = urllib.request.Request(base + HTTP_ROUTE, headers={TENANT_METADATA: tenant})
    with urllib.request.urlopen(request, timeout=CALL_S) as reply:
        return str(json.loads(reply.read())["name"])


async def grpc_replica(channel: grpc.aio.Channel, tenant: str) -> str:
    """The stand-in replica the gRPC door sends ``tenant`` to, its call ended before this returns."""
    name, call = await asyncio.wait_for(hold(channel, tenant, now=True), CALL_S)
    if call is not None:
        await asyncio.wait_for(call.code(), CALL_S)  # ended: it no longer counts in the replica's load
    return name


@pytest.mark.asyncio
async def test_a_tenants_two_doors_lead_to_the_same_replica_and_both_replicas_get_tenants(tmp_path: Path) -> None:
    async with fakes_behind_the_proxy(tmp_path, "tenant") as (_, proxy):
        async with grpc.aio.insecure_channel(proxy.grpc_target) as channel:
            by_grpc = [await grpc_replica(channel, f"t{i}") for i in range(TENANTS)]
            by_http = [await asyncio.to_thread(http_replica, proxy.http_base, f"t{i}") for i in range(TENANTS)]
            for i in range(TENANTS):  # bounded loads spill a tenant while another's call is still closing
                for _ in range(ASK_AGAIN if by_grpc[i] != by_http[i] else 0):
                    await asyncio.sleep(IDLE_S)
                    by_grpc[i] = await grpc_replica(channel, f"t{i}")
                    by_http[i] = await asyncio.to_thread(http_replica, proxy.http_base, f"t{i}")
                    if by_grpc[i] == by_http[i]:
                        break
        assert by_grpc == by_http  # the same ring on both doors: a tenant's caches are on one replica
        assert set(by_grpc) == {"r1", "r2"}


def k8s_routing() -> list[dict[str, Any]]:
    return [doc for path in sorted(ROUTING.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_kustomization_lists_every_routing_manifest() -> None:
    listed = yaml.safe_load((ROUTING / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in ROUTING.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_routes_reach_the_generator_services_ports() -> None:
    docs = {d["kind"]: d for d in k8s_routing() if d["kind"] in ("GRPCRoute", "HTTPRoute")}
    grpc_rule = docs["GRPCRoute"]["spec"]["rules"][0]
    assert grpc_rule["matches"][0]["method"]["service"] == GENERATOR_SERVICE
    assert grpc_rule["backendRefs"] == [{"name": "generator", "port": GRPC_PORTS["generator"]}]
    assert docs["HTTPRoute"]["spec"]["rules"][0]["backendRefs"] == [{"name": "generator", "port": HTTP_PORT}]


def test_every_policy_hashes_on_x_tenant_and_targets_a_route_that_exists() -> None:
    docs = k8s_routing()
    routes = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].endswith("Route")}
    policies = [d for d in docs if d["kind"] == "BackendTrafficPolicy"]
    assert {(t["kind"], t["name"]) for p in policies for t in p["spec"]["targetRefs"]} == routes
    for policy in policies:
        lb = policy["spec"]["loadBalancer"]
        assert lb["type"] == "ConsistentHash" and lb["consistentHash"]["header"]["name"] == TENANT_METADATA
        assert policy["spec"]["healthCheck"]["active"]["type"] in ("GRPC", "HTTP")
