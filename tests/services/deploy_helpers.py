"""Readers of deploy/ for tests/services/test_ops_deploy.py: manifests, compose, Dockerfile, LAR_* env."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

from services.common import ports
from services.common.settings import ServerSettings
from services.config import SECTIONS

REPO = Path(__file__).resolve().parents[2]
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
