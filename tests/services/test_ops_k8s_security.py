"""deploy/k8s, checked statically, part three: the shipped configuration is closed. Auth is required,
TLS is on (no allow_insecure), keys and certificates come from Secrets (never the ConfigMap), the
probes still reach the health service (over TLS), and the NetworkPolicy denies by default and admits
each service's callers on ports its Services expose."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lookahead_rag.services.common import ports
from lookahead_rag.services.common.auth.devpki import make_pki
from lookahead_rag.services.common.auth.tls import TlsSettings, server_credentials
from tests.services.deploy_helpers import (
    HEALTH_TIMEOUT_S,
    K8S,
    K8S_VERSION,
    NAMESPACE,
    configmap_data,
    configmap_toml,
    container,
    k8s_docs,
    k8s_env,
    selects,
    workload,
)

TEMPLATES = K8S / "templates"
SECRETS = TEMPLATES / "secrets.yaml"
PLACEHOLDER = "REPLACE-ME"
PROBE_KEY = "grpc-health.py"  # the ConfigMap key of the probe script
CONFIG_DIR = "/etc/lookahead-rag"  # where every pod mounts the ConfigMap
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
SERVICE_KEY_ENV = "LAR_AUTH_SERVICE_KEY"
ANY = "any"  # a rule without `from`
PROMETHEUS = "namespace monitoring"
MIN_PROBE_TIMEOUT_S = 5  # the probe starts a fresh Python that imports grpc (the default 1 s is too short)


def template_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def mounts_of(service: str) -> dict[str, str]:
    """Volume name -> mount path in the service's container."""
    return {m["name"]: m["mountPath"] for m in container(service)["volumeMounts"]}


def secret_volumes(service: str) -> dict[str, str]:
    """Secret name -> where the service's container mounts it."""
    pod = workload(service)["spec"]["template"]["spec"]
    mounts = mounts_of(service)
    return {v["secret"]["secretName"]: mounts[v["name"]] for v in pod["volumes"] if "secret" in v}


def secret_env(service: str) -> dict[str, tuple[str, str]]:
    """Env name -> (Secret, key) of the variables the container reads from a Secret."""
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container(service).get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


# --- auth, TLS, Secrets --------------------------------------------------------------------------------


def test_auth_is_required_and_tls_is_on_without_allow_insecure() -> None:
    config = configmap_toml()
    assert config["auth"]["mode"] == "required" and config["auth"]["keys_file"]
    assert "allow_insecure" not in config["tls"]
    tls = TlsSettings(**config["tls"])
    assert tls.server_enabled and tls.client_enabled and not tls.allow_insecure
    # never a literal key in the ConfigMap: the service key comes from a Secret, as env
    assert "service_key" not in config["auth"]
    assert "allow_insecure" not in configmap_data()["config.toml"].replace("# ", "")


@pytest.mark.parametrize("service", ports.SERVICES)
def test_every_app_pod_mounts_the_keys_file_and_the_certificate_from_secrets(service: str) -> None:
    config = configmap_toml()
    mounted = secret_volumes(service)
    paths = [config["auth"]["keys_file"], *(config["tls"][f] for f in ("cert_file", "key_file", "ca_file"))]
    for path in paths:  # each file the config names lies in a Secret mounted read-only
        folder = str(PurePosixPath(path).parent)
        assert folder in mounted.values(), f"{service}: nothing mounted at {folder}"
    read_only = {m["mountPath"]: m.get("readOnly") for m in container(service)["volumeMounts"]}
    assert all(read_only[p] is True for p in mounted.values())
    env = secret_env(service)
    if service == "generator":  # the one caller of other services sends the service key
        assert env[SERVICE_KEY_ENV][0] not in mounted and k8s_env(service)[SERVICE_KEY_ENV] == ""
    else:  # nobody else holds it
        assert SERVICE_KEY_ENV not in env and SERVICE_KEY_ENV not in k8s_env(service)


def test_the_secret_template_has_every_secret_and_key_the_pods_use_and_no_real_data() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = template_docs(SECRETS)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert len(secrets) == len(docs) and all(d["metadata"]["namespace"] == NAMESPACE for d in docs)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert all(value.startswith(PLACEHOLDER) for value in doc["stringData"].values())
    config = configmap_toml()
    used: dict[str, set[str]] = {}
    for service in ports.SERVICES:
        for name, folder in secret_volumes(service).items():
            files = [p for p in (config["auth"]["keys_file"], *config["tls"].values()) if isinstance(p, str)]
            used.setdefault(name, set()).update(PurePosixPath(p).name for p in files
                                                 if str(PurePosixPath(p).parent) == folder)
        for name, key in secret_env(service).values():
            used.setdefault(name, set()).add(key)
    assert {name: set(secrets[name]["stringData"]) for name in used} == used
    assert secrets["lookahead-rag-tls"]["type"] == "kubernetes.io/tls"
    # not applied by kustomize: `apply -k` must never replace the real Secrets with placeholders
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert not any("templates" in r for r in kustomization["resources"])
    assert "lookahead-rag keys add" in SECRETS.read_text() and "service-key" in SECRETS.read_text()


# --- probes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ports.SERVICES)
def test_probes_ask_the_health_service_over_tls(service: str) -> None:
    main = container(service)
    ca_file = configmap_toml()["tls"]["ca_file"]
    assert mounts_of(service)["config"] == CONFIG_DIR and PROBE_KEY in configmap_data()
    for probe in PROBES:
        command = main[probe]["exec"]["command"]
        assert command == ["python", f"{CONFIG_DIR}/{PROBE_KEY}", str(ports.GRPC_PORTS[service]), ca_file], probe
        assert main[probe]["timeoutSeconds"] >= MIN_PROBE_TIMEOUT_S, probe


def run_probe(script: Path, port: int, ca: Path) -> int:
    argv = [sys.executable, str(script), str(port), str(ca)]
    return subprocess.run(argv, capture_output=True, timeout=HEALTH_TIMEOUT_S, check=False).returncode


def test_the_probe_script_is_healthy_only_while_serving_over_tls(tmp_path: Path) -> None:
    script = tmp_path / PROBE_KEY
    script.write_text(configmap_data()[PROBE_KEY])
    pki = make_pki(tmp_path)  # a server certificate for localhost, as the real one must name

    async def scenario() -> list[int]:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        tls = TlsSettings(cert_file=pki.server_cert, key_file=pki.server_key)
        port = server.add_secure_port("127.0.0.1:0", server_credentials(tls))
        await server.start()
        codes = []
        for status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING):
            await servicer.set(health.OVERALL_HEALTH, status)
            codes.append(await asyncio.to_thread(run_probe, script, port, pki.ca))
        await servicer.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        codes.append(await asyncio.to_thread(run_probe, script, port, pki.rogue_ca))  # a CA that did not sign it
        await server.stop(None)
        codes.append(await asyncio.to_thread(run_probe, script, port, pki.ca))  # nothing listens any more
        return codes

    assert [code == 0 for code in asyncio.run(scenario())] == [True, False, False, False]


# --- NetworkPolicy ---------------------------------------------------------------------------------------


def policies(docs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [doc for _, doc in docs if doc["kind"] == "NetworkPolicy"]


def source(peer: dict[str, Any]) -> str:
    """A ``from`` entry as text: the component of a pod of this namespace, or the namespace named."""
    if "namespaceSelector" in peer:
        return "namespace " + peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    return peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]


def admitted(docs: list[tuple[str, dict[str, Any]]], service: str) -> set[tuple[str, str]]:
    """(source, port) pairs the policies selecting the service's pods admit."""
    labels = workload(service)["spec"]["template"]["metadata"]["labels"]
    out = set()
    for policy in policies(docs):
        spec = policy["spec"]
        if spec["podSelector"] and not selects(spec["podSelector"]["matchLabels"], labels):
            continue
        for rule in spec.get("ingress", []):
            for peer in rule.get("from") or [{}]:
                out |= {(source(peer) if peer else ANY, str(p["port"])) for p in rule["ports"]}
    return out


def port_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Every port a NetworkPolicy admits to a workload must be a container port of its pods (by name or
    number) that a Service selecting those pods exposes."""
    problems = []
    for policy in policies(docs):
        spec, name = policy["spec"], policy["metadata"]["name"]
        for _, doc in docs:
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                continue
            labels = doc["spec"]["template"]["metadata"]["labels"]
            if spec["podSelector"] and not selects(spec["podSelector"]["matchLabels"], labels):
                continue
            (main,) = doc["spec"]["template"]["spec"]["containers"]
            named = {p["name"]: p["containerPort"] for p in main["ports"]}
            exposed = {str(p.get("targetPort", p["port"])) for _, s in docs if s["kind"] == "Service"
                       and selects(s["spec"]["selector"], labels) for p in s["spec"]["ports"]}
            for rule in spec.get("ingress", []):
                for p in rule["ports"]:
                    port = str(p["port"])
                    number = named.get(port, port)
                    if str(number) not in map(str, named.values()):
                        problems.append(f"{name}: {doc['metadata']['name']} has no port {port}")
                    elif port not in exposed and not ({n for n, v in named.items() if str(v) == port} & exposed):
                        problems.append(f"{name}: no Service exposes {doc['metadata']['name']}'s port {port}")
    return problems


def test_the_network_policy_is_applied_and_denies_ingress_by_default() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]
    deny = [p for p in policies(k8s_docs()) if p["spec"]["podSelector"] == {}]
    assert [p["spec"] for p in deny if "ingress" not in p["spec"]] == [{"podSelector": {}, "policyTypes": ["Ingress"]}]
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in policies(k8s_docs()))


def test_each_service_admits_only_its_callers() -> None:
    docs = k8s_docs()
    metrics = (PROMETHEUS, "metrics")
    assert admitted(docs, "retriever") == {("generator", "grpc"), metrics}
    assert admitted(docs, "draftcache") == {("generator", "grpc"), metrics}
    assert admitted(docs, "generator") == {(ANY, "grpc"), (ANY, "http"), metrics}


def test_every_admitted_port_is_exposed_by_a_service() -> None:
    assert port_problems(k8s_docs()) == []


def test_the_port_check_catches_a_port_no_service_exposes() -> None:
    docs = copy.deepcopy(k8s_docs())
    (retriever,) = [d for d in policies(docs) if d["metadata"]["name"].startswith("retriever")]
    retriever["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 9999})
    (service,) = [d for _, d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "generator"]
    service["spec"]["ports"] = [p for p in service["spec"]["ports"] if p["name"] != "http"]
    assert sorted(port_problems(docs)) == [
        "generator-from-clients: no Service exposes generator's port http",
        "retriever-from-generator: retriever has no port 9999",
    ]


def test_kafka_admits_only_the_lookahead_rag_pods_in_its_own_template() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    (policy,) = template_docs(TEMPLATES / "kafka-networkpolicy.yaml")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    clients = policy["spec"]["ingress"][0]
    (peer,) = clients["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    # every pod of ours carries the label it admits (the services, the topic Job, their init containers)
    for _, doc in k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            assert selects(peer["podSelector"]["matchLabels"], doc["spec"]["template"]["metadata"]["labels"])
    bootstrap_port = int(configmap_data()["kafka-bootstrap"].rpartition(":")[2])  # what the pods dial
    assert [p["port"] for p in clients["ports"]] == [bootstrap_port]
