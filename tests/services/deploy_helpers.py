"""Readers of deploy/ for tests/services/test_ops_deploy.py: manifests, compose, Dockerfile, LAR_* env."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lookahead_rag.services.common import ports
from lookahead_rag.services.common.settings import ServerSettings
from lookahead_rag.services.config import SECTIONS

REPO = Path(__file__).resolve().parents[2]

K8S_VERSION = "1.33"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"lookahead-rag:{VERSION}"
DEPLOYED_SERVER_FIELDS = {"host", "port", "metrics_port"}  # ServerSettings fields deploy/ sets
DOCUMENTS_DLT_TOPIC = ports.DOCUMENTS_DLT_TOPIC
ALL_TOPICS = {ports.EVENTS_TOPIC, ports.EVENTS_DLT_TOPIC, ports.DOCUMENTS_TOPIC, DOCUMENTS_DLT_TOPIC}
MIN_INSYNC_REPLICAS = 2  # k8s topics: acks=all survives the loss of one of 3 replicas
CONFIGMAP = "lookahead-rag-config"
TOPIC_JOB = "lookahead-rag-topics"
HEALTH_TIMEOUT_S = 30  # one run of the compose healthcheck command (a fresh Python imports grpc)
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
NAMESPACE = "lookahead-rag"


# --- helpers ----------------------------------------------------------------------------------------


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def k8s(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in k8s_docs() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def configmap_toml() -> dict[str, Any]:
    return tomllib.loads(k8s("ConfigMap", "lookahead-rag-config")["data"]["config.toml"])


def workload(service: str) -> dict[str, Any]:
    docs = [doc for _, doc in k8s_docs()
            if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] == service]
    assert len(docs) == 1, f"one Deployment or StatefulSet named {service}"
    return docs[0]


def container(service: str) -> dict[str, Any]:
    (only,) = workload(service)["spec"]["template"]["spec"]["containers"]
    return only


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def section_fields(section: str) -> set[str]:
    """The fields deploy/ may set in a section: its settings class's (a gRPC service's class is a
    ServerSettings, so host, port, metrics_port and shutdown_grace_s are among them)."""
    cls = SECTIONS[section]
    if section in ports.GRPC_PORTS:
        assert issubclass(cls, ServerSettings), f"{cls.__name__} must derive from ServerSettings"
    return set(cls.model_fields)


def kafka_default(field: str) -> Any:
    return SECTIONS["kafka"].model_fields[field].default


def split_env(var: str) -> tuple[str, str]:
    """LAR_<SECTION>_<FIELD> -> (section, field)."""
    for section, prefix in ports.ENV_PREFIXES.items():
        if var.startswith(prefix):
            return section, var[len(prefix):].lower()
    raise AssertionError(f"{var}: no section has this prefix ({', '.join(ports.ENV_PREFIXES.values())})")


def compose_env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (compose()["services"][service].get("environment") or {}).items()}


def k8s_env(service: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(service).get("env", [])}


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in dockerfile():
        if word == "ENV":
            env.update(dict(item.split("=", 1) for item in shlex.split(rest)))
    return env


def all_lar_env() -> list[tuple[str, str, str]]:
    """(where, name, value) of every LAR_* variable deploy/ sets."""
    found = [("Dockerfile", k, v) for k, v in dockerfile_env().items()]
    for service in compose()["services"]:
        found += [(f"compose {service}", k, v) for k, v in compose_env(service).items()]
    for service in ports.SERVICES:
        found += [(f"k8s {service}", k, v) for k, v in k8s_env(service).items()]
    return [(where, k, v) for where, k, v in found if k.startswith("LAR_")]


# --- topics -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreatedTopic:
    """One ``kafka-topics.sh --create`` of a topic: its partitions, replication and --config pairs."""

    partitions: int
    replication: int
    configs: dict[str, str]


def topics_created(command: str) -> dict[str, CreatedTopic]:
    """topic -> what it is created with, from ``kafka-topics.sh --create`` commands joined by &&."""
    topics = {}
    for part in command.split("&&"):
        words = shlex.split(part)
        assert "--create" in words, f"not a --create command: {part.strip()[:80]}"
        options = {w[2:]: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--") and w != "--config"}
        configs = dict(words[i + 1].split("=", 1) for i, w in enumerate(words[:-1]) if w == "--config")
        topics[options["topic"]] = CreatedTopic(int(options["partitions"]), int(options["replication-factor"]), configs)
    return topics


def compose_topics() -> dict[str, CreatedTopic]:
    return topics_created(" ".join(compose()["services"]["kafka-topics"]["command"]))


def job_topics() -> dict[str, CreatedTopic]:
    (job_container,) = k8s("Job", "lookahead-rag-topics")["spec"]["template"]["spec"]["containers"]
    return topics_created(" ".join(job_container["args"]))


def documents() -> list[Path]:
    """deploy/'s hand-written documentation (CONFIG.md is generated from the settings classes)."""
    return [path for path in sorted(DEPLOY.glob("*.md")) if path.name != "CONFIG.md"]


# --- pods, Services, disruption budgets ---------------------------------------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
POD_KINDS = (*WORKLOAD_KINDS, "Job")


def configmap_data() -> dict[str, str]:
    return k8s("ConfigMap", "lookahead-rag-config")["data"]


def pod_specs(docs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """("Kind/name", pod spec) of every pod template in ``docs``."""
    return [(f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
            for _, doc in docs if doc["kind"] in POD_KINDS]


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def env_from_configmap(container_spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Env name -> (ConfigMap, key) of the variables a container reads from a ConfigMap key."""
    out = {}
    for env in container_spec.get("env", []):
        ref = env.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            out[env["name"]] = (ref["name"], ref["key"])
    return out


def lists_unready_pods(service: dict[str, Any]) -> bool:
    return bool(service["spec"].get("publishNotReadyAddresses"))


def traffic_texts(docs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(where, text) of everything that can point a client at an address: ConfigMap values, every
    container's env values, command and args, and the deploy/ documentation."""
    texts = [(f"ConfigMap/{doc['metadata']['name']}[{key}]", str(value))
             for _, doc in docs if doc["kind"] == "ConfigMap" for key, value in doc.get("data", {}).items()]
    for where, pod in pod_specs(docs):
        for c in all_containers(pod):
            texts += [(f"{where} {c['name']} env {e['name']}", str(e["value"]))
                      for e in c.get("env", []) if "value" in e]
            texts += [(f"{where} {c['name']} command", " ".join(c.get("command", []) + c.get("args", [])))]
    texts += [(f"deploy/{path.name}", path.read_text()) for path in documents()]
    return texts


def traffic_targets(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """Service name -> where it is dialled as HOST:PORT (short name or FQDN, a pod's name under it too)."""
    names = [doc["metadata"]["name"] for _, doc in docs if doc["kind"] == "Service"]
    found: dict[str, list[str]] = {}
    for where, text in traffic_texts(docs):
        for name in names:
            host = rf"(?<![\w.-])(?:[\w-]+\.)?{re.escape(name)}(?:\.{NAMESPACE}(?:\.svc(?:\.cluster\.local)?)?)?:\d+"
            if re.search(host, text):
                found.setdefault(name, []).append(where)
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def min_replicas(docs: list[tuple[str, dict[str, Any]]], workload_doc: dict[str, Any]) -> int:
    """The fewest replicas the workload runs: its HPA's minReplicas when one scales it, else replicas."""
    name, kind = workload_doc["metadata"]["name"], workload_doc["kind"]
    for _, doc in docs:
        if doc["kind"] == "HorizontalPodAutoscaler" and doc["spec"]["scaleTargetRef"]["name"] == name \
                and doc["spec"]["scaleTargetRef"]["kind"] == kind:
            return doc["spec"].get("minReplicas", 1)
    return workload_doc["spec"].get("replicas", 1)


def has_state(workload_doc: dict[str, Any]) -> bool:
    """A PersistentVolumeClaim per replica or a claim mounted into its pods."""
    pod = workload_doc["spec"]["template"]["spec"]
    return bool(workload_doc["spec"].get("volumeClaimTemplates")) or any(
        "persistentVolumeClaim" in volume for volume in pod.get("volumes", []))


def _count(value: int | str, replicas: int, round_up: bool) -> int:
    """A PDB's minAvailable/maxUnavailable (a count or "N%") as a number of pods."""
    if isinstance(value, int):
        return value
    share = int(value.removesuffix("%")) * replicas
    return -(-share // 100) if round_up else share // 100


def disruptions_allowed(pdb: dict[str, Any], replicas: int) -> int:
    """Pods a drain may evict at once with ``replicas`` healthy pods (Kubernetes rounds minAvailable %
    and maxUnavailable % up)."""
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return max(0, replicas - _count(spec["minAvailable"], replicas, round_up=True))
    return max(0, min(replicas, _count(spec["maxUnavailable"], replicas, round_up=True)))


def disruption_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """What is wrong with the PodDisruptionBudgets of ``docs``: a Deployment/StatefulSet with more than one
    replica or with state and no PDB (or several: eviction then fails), a PDB that blocks every drain,
    or one that lets a drain take every replica of a replicated workload."""
    problems = []
    pdbs = [doc for _, doc in docs if doc["kind"] == "PodDisruptionBudget"]
    for _, doc in docs:
        if doc["kind"] not in WORKLOAD_KINDS:
            continue
        name, replicas = f"{doc['kind']}/{doc['metadata']['name']}", min_replicas(docs, doc)
        if replicas <= 1 and not has_state(doc):
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pdbs if p["metadata"]["namespace"] == doc["metadata"]["namespace"]
                and selects(p["spec"]["selector"].get("matchLabels", {}), labels)]
        if len(mine) != 1:
            problems.append(f"{name}: {len(mine)} PodDisruptionBudgets select it (want 1)")
            continue
        allowed = disruptions_allowed(mine[0], replicas)
        if allowed < 1:
            problems.append(f"{name}: its PDB allows no eviction with {replicas} replicas (drains hang)")
        if replicas > 1 and allowed >= replicas:
            problems.append(f"{name}: its PDB lets a drain evict all {replicas} replicas at once")
    return problems


# --- compose ------------------------------------------------------------------------------------------

LOOPBACK = frozenset({"127.0.0.1", "::1", "[::1]", "localhost"})


def published_ports(spec: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of a compose service's ``ports`` ("" = all interfaces)."""
    out = []
    for entry in spec.get("ports", []):
        if isinstance(entry, dict):  # long syntax
            published = entry.get("published", entry["target"])
            out.append((entry.get("host_ip", ""), int(published), int(entry["target"])))
            continue
        text = str(entry).split("/")[0]
        host, _, rest = text.rpartition("]:") if text.startswith("[") else ("", "", text)
        parts = rest.split(":")
        if host:  # [v6 address]:published:target
            out.append((host + "]", int(parts[0]), int(parts[1])))
        elif len(parts) == 3:
            out.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            out.append(("", int(parts[0]), int(parts[1])))
        else:
            out.append(("", int(parts[0]), int(parts[0])))
    return out


def ports_open_to_all(services: dict[str, Any]) -> list[str]:
    """"service: host:published" of every port published beyond this machine's loopback."""
    return [f"{name}: {host or '*'}:{published}"
            for name, spec in services.items()
            for host, published, _ in published_ports(spec) if host not in LOOPBACK]


def depends_on_problems(services: dict[str, Any]) -> list[str]:
    """A dependency started before it is ready: list syntax (= service_started), a service with a
    healthcheck not awaited as service_healthy, a one-shot (restart "no") not awaited as
    service_completed_successfully."""
    problems = []
    for name, spec in services.items():
        depends = spec.get("depends_on", {})
        if isinstance(depends, list):
            problems.append(f"{name}: depends_on as a list only waits for the start")
            continue
        for upstream, condition in depends.items():
            target = services[upstream]
            if target.get("restart") == "no":
                want = "service_completed_successfully"
            elif "healthcheck" in target:
                want = "service_healthy"
            else:
                want = "service_started"
            if condition.get("condition") != want:
                problems.append(f"{name} -> {upstream}: {condition.get('condition')} (want {want})")
    return problems


def expected_ports(service: str) -> dict[str, int]:
    """Named container (and Service) ports: gRPC, metrics, and the generator's HTTP endpoint."""
    named = {"grpc": ports.GRPC_PORTS[service], "metrics": ports.METRICS_PORTS[service]}
    return named | ({"http": ports.HTTP_PORT} if service == "generator" else {})
