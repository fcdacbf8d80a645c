"""The tenant-routing proxy configurations in deploy/: the Caddyfile the tests and the benchmark run
(caddy adapts it; it hashes on the same header our clients send; its gRPC health check is the
length-prefixed empty HealthCheckRequest and accepts SERVING only) and the Kubernetes Gateway API
manifests (deploy/k8s/routing: the routes reach the generator Service's ports, every policy hashes on
x-tenant and targets a route that exists, the kustomization lists every file)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc_health.v1 import health_pb2

from lookahead_rag.bench.caddy_proxy import DEPLOY_CADDY, CaddyMissingError, caddy_binary
from lookahead_rag.services.common.ports import GRPC_PORTS, HTTP_PORT
from lookahead_rag.services.common.rpc.tenant_route import TENANT_METADATA
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.v1 import generator_pb2

ROUTING = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "routing"
GENERATOR_SERVICE = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name


def grpc_frame(message: Any) -> bytes:
    """A gRPC message on the wire: uncompressed flag, 4-byte big-endian length, the bytes."""
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def adapted(routing: str) -> dict[str, Any]:
    """The Caddyfile as caddy's JSON, for two upstreams and ``routing``."""
    try:
        binary = caddy_binary()
    except CaddyMissingError as exc:
        pytest.skip(f"the proxy is not installed: {exc}")
    env = {**os.environ, "PROXY_ROUTING": routing, "PROXY_DIR": str(DEPLOY_CADDY),
           "PROXY_GRPC_UPSTREAMS": "h2c://10.0.0.1:50053 h2c://10.0.0.2:50053",
           "PROXY_HTTP_UPSTREAMS": "10.0.0.1:8080 10.0.0.2:8080"}
    out = subprocess.run([str(binary), "adapt", "--config", str(DEPLOY_CADDY / "Caddyfile")], env=env,
                         capture_output=True, check=True, timeout=30)
    return dict(json.loads(out.stdout))


def proxies(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """listen address -> its reverse_proxy handler."""
    servers = config["apps"]["http"]["servers"].values()
    return {s["listen"][0]: s["routes"][0]["handle"][0] for s in servers}


def test_caddy_hashes_each_door_on_the_clients_tenant_header_with_bounded_load() -> None:
    doors = proxies(adapted("tenant"))
    assert set(doors) == {":50050", ":8088"}
    for handler in doors.values():
        policy = handler["load_balancing"]["selection_policy"]
        assert policy["policy"] == "header" and policy["field"] == TENANT_METADATA == HttpSettings().tenant_header
        assert handler["health_checks"]["passive"]["unhealthy_request_count"] > 0  # the bound: spill past it
        assert len(handler["upstreams"]) == 2
    assert doors[":50050"]["transport"]["versions"][0] == "h2c"  # gRPC to the replicas in cleartext HTTP/2


def test_caddy_round_robin_is_the_same_file_with_another_policy() -> None:
    doors = proxies(adapted("round_robin"))
    assert {h["load_balancing"]["selection_policy"]["policy"] for h in doors.values()} == {"round_robin"}


def test_caddy_checks_grpc_health_and_only_serving_passes() -> None:
    active = proxies(adapted("tenant"))[":50050"]["health_checks"]["active"]
    assert active["uri"] == "/grpc.health.v1.Health/Check" and active["method"] == "POST"
    # the request body file is exactly an empty HealthCheckRequest in gRPC framing
    assert (DEPLOY_CADDY / "grpc-health-check.bin").read_bytes() == grpc_frame(health_pb2.HealthCheckRequest())
    expect = re.compile(active["expect_body"].encode())
    status = health_pb2.HealthCheckResponse
    assert expect.search(grpc_frame(status(status=status.SERVING)))
    for other in (status.NOT_SERVING, status.UNKNOWN, status.SERVICE_UNKNOWN):
        assert not expect.search(grpc_frame(status(status=other)))
    assert proxies(adapted("tenant"))[":8088"]["health_checks"]["active"]["uri"] == "/health"


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
