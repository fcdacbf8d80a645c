"""deploy/, checked statically, part four: client-side load balancing over headless Services, graceful
rollout (preStop, drain, grace within terminationGracePeriodSeconds), secrets mounted as files, and
the Kafka command-line tools configured like the services (--command-config)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from lookahead_rag.services.common import ports
from lookahead_rag.services.common.settings import env_name, load_settings
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from tests.services.deploy_helpers import (
    DEPLOY,
    K8S,
    NAMESPACE,
    TOPIC_JOB,
    all_containers,
    compose,
    configmap_data,
    configmap_toml,
    container,
    k8s,
    k8s_docs,
    kafka_default,
    pod_specs,
    workload,
)

SCRIPT_KEY = "kafka-client.sh"  # the ConfigMap key (and deploy/ file) writing --command-config
KAFKA_SECRET = "lookahead-rag-kafka"  # the Secret holding Kafka's SASL user, password and CA
UPSTREAMS = tuple(ports.GENERATOR_UPSTREAM_FIELDS)  # the Services the generator balances over
TOPICS_CALL = re.compile(r"kafka-topics\.sh\b(.*?)(?=&&|;|$)", re.S)  # one kafka-topics.sh invocation


def target_host(target: str) -> str:
    """dns:///HOST:PORT -> HOST."""
    assert target.startswith("dns:///"), target
    return target.removeprefix("dns:///").rpartition(":")[0]


def kafka_scripts() -> list[tuple[str, str]]:
    """(where, shell text) of every container running kafka-topics.sh: the Job, init containers, compose."""
    found = [(f"{where} {c['name']}", " ".join(c.get("command", []) + c.get("args", [])))
             for where, pod in pod_specs(k8s_docs()) for c in all_containers(pod)]
    found += [(f"compose {name}", " ".join(spec.get("command") or []))
              for name, spec in compose()["services"].items()]
    return [(where, text) for where, text in found if "kafka-topics.sh" in text]


def env_values(spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in spec.get("env", [])}


# --- load balancing over headless Services --------------------------------------------------------------


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_the_generator_balances_over_every_ready_replica(upstream: str) -> None:
    config = configmap_toml()
    host = target_host(config["generator"][ports.GENERATOR_UPSTREAM_FIELDS[upstream]])
    # a dns:/// target naming the upstream's Service in this namespace
    name, namespace = host.split(".")[:2]
    assert (name, namespace) == (upstream, NAMESPACE)
    service = k8s("Service", name)["spec"]
    # headless: the name resolves to every ready pod (never one that is not ready)
    assert service["clusterIP"] == "None" and not service.get("publishNotReadyAddresses")
    # the Service selects exactly the upstream's pods, on its gRPC port
    assert service["selector"].items() <= workload(upstream)["spec"]["template"]["metadata"]["labels"].items()
    assert {p["name"]: p["port"] for p in service["ports"]}["grpc"] == ports.GRPC_PORTS[upstream]
    # the channel spreads the calls (round_robin, health-checked, retried)
    assert config["channels"]["load_balancing"] == "round_robin" and config["channels"]["health_check"] is True


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_the_network_policy_still_admits_the_generator_to_every_replica(upstream: str) -> None:
    (policy,) = [doc for _, doc in k8s_docs() if doc["kind"] == "NetworkPolicy"
                 and doc["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == upstream]
    # the policy selects the pods the headless Service lists, and admits the generator on their gRPC port
    assert policy["spec"]["podSelector"]["matchLabels"] == k8s("Service", upstream)["spec"]["selector"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["grpc"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "generator"


# --- graceful rollout -----------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ports.SERVICES)
def test_termination_grace_covers_prestop_drain_grace_and_flush(service: str) -> None:
    config = configmap_toml()
    pod = workload(service)["spec"]["template"]["spec"]
    pre_stop = container(service)["lifecycle"]["preStop"]
    # the preStop hook sleeps (the kubelet's sleep action: no binary needed) while endpoints update
    seconds = pre_stop["sleep"]["seconds"]
    assert seconds > 0
    # then SIGTERM: a drain (NOT_SERVING, still serving), the grace, the bus's flush/commit
    drain, grace = config[service]["drain_s"], config[service]["shutdown_grace_s"]
    flush = config["kafka"].get("shutdown_timeout_s", kafka_default("shutdown_timeout_s"))
    assert drain > 0 and grace > 0
    assert seconds + drain + grace + flush < pod["terminationGracePeriodSeconds"]


# --- secrets as files -----------------------------------------------------------------------------------


def secrets_volume(pod: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The volume a container mounts at its $LAR_SECRETS_DIR."""
    path = env_values(spec)[ports.SECRETS_DIR_ENV]
    (mount,) = [m for m in spec["volumeMounts"] if m["mountPath"] == path]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume


def test_kafka_secrets_are_mounted_as_files_wherever_kafka_is_used() -> None:
    users = [(where, pod, c) for where, pod in pod_specs(k8s_docs()) for c in all_containers(pod)
             if c["name"] in ("wait-for-topics", "create-topics") or c["name"] in ports.SERVICES]
    assert len(users) == 6  # the three services, two init containers, the topic Job
    for where, pod, spec in users:
        volume = secrets_volume(pod, spec)
        (source,) = [s["secret"] for s in volume["projected"]["sources"] if s["secret"]["name"] == KAFKA_SECRET]
        # optional: a plaintext Kafka needs no Secret; the whole Secret, its keys are the file names
        assert source["optional"] is True and "items" not in source, where


def test_the_kafka_secret_template_names_real_fields() -> None:
    docs = [d for d in yaml.safe_load_all((K8S / "templates" / "secrets.yaml").read_text()) if d]
    (secret,) = [d for d in docs if d["metadata"]["name"] == KAFKA_SECRET]
    keys = set(secret["stringData"])
    fields = {env_name(KafkaSettings, f) for f in ("sasl_plain_username", "sasl_plain_password")}
    # the SASL user and password are files named like their variables; the CA is the file ssl_cafile names
    assert fields <= keys
    ca = re.search(r'#\s*ssl_cafile\s*=\s*"([^"]+)"', configmap_data()["config.toml"])
    assert ca is not None and PurePosixPath(ca.group(1)).name in keys - fields


# --- the Kafka command-line tools -----------------------------------------------------------------------


def test_every_kafka_topics_call_passes_the_command_config() -> None:
    scripts = kafka_scripts()
    assert {where.split()[0] for where, _ in scripts} >= {f"Job/{TOPIC_JOB}", "StatefulSet/retriever",
                                                          "StatefulSet/draftcache", "compose"}
    for where, text in scripts:
        written = re.search(r"kafka-client\.sh (\S+);", text)
        # the script writes the properties first, and every invocation reads that file
        assert written is not None, where
        calls = TOPICS_CALL.findall(text)
        assert calls and all(f"--command-config {written.group(1)}" in call for call in calls), where


def test_the_script_in_the_configmap_is_the_one_in_deploy() -> None:
    # compose mounts deploy/kafka-client.sh; the ConfigMap carries the same text
    assert configmap_data()[SCRIPT_KEY] == (DEPLOY / SCRIPT_KEY).read_text()
    (topics,) = [spec for name, spec in compose()["services"].items() if name == "kafka-topics"]
    assert any(v.startswith(f"./{SCRIPT_KEY}:") for v in topics["volumes"])
    # compose's topic service reads the services' own LAR_KAFKA_* (the same x-kafka-env)
    assert topics["environment"].items() >= {k: v for k, v in compose()["services"]["retriever"]["environment"].items()
                                              if k.startswith(ports.ENV_PREFIXES["kafka"])}.items()


def run_script(config: Path, secrets: Path, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "client.properties"
    env = {"PATH": os.environ["PATH"], ports.CONFIG_ENV: str(config), ports.SECRETS_DIR_ENV: str(secrets)}
    script = tmp_path / SCRIPT_KEY
    script.write_text(configmap_data()[SCRIPT_KEY])
    subprocess.run(["bash", str(script), str(out)], env=env, check=True, capture_output=True, timeout=30)
    return dict(line.split("=", 1) for line in out.read_text().splitlines())


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
@pytest.mark.parametrize("protocol,mechanism", [("PLAINTEXT", None), ("SASL_SSL", "SCRAM-SHA-512"),
                                                ("SASL_PLAINTEXT", "PLAIN")])
def test_the_properties_carry_what_the_services_read(protocol: str, mechanism: str | None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for var in list(os.environ):
        if var.startswith("LAR_"):
            monkeypatch.delenv(var)
    text = configmap_data()["config.toml"]
    if protocol != "PLAINTEXT":  # what deploy/README.md says to do for a managed cluster
        text = text.replace('# security_protocol = "SASL_SSL"', f'security_protocol = "{protocol}"')
        text = text.replace('# sasl_mechanism = "SCRAM-SHA-512"', f'sasl_mechanism = "{mechanism}"')
        if protocol.endswith("SSL"):
            text = text.replace("# ssl_cafile", "ssl_cafile")
    config, secrets = tmp_path / "config.toml", tmp_path / "secrets"
    config.write_text(text)
    secrets.mkdir()
    (secrets / "LAR_KAFKA_SASL_PLAIN_USERNAME").write_text("lar\n")
    (secrets / "LAR_KAFKA_SASL_PLAIN_PASSWORD").write_text('p"w\\1\n')
    monkeypatch.setenv(ports.CONFIG_ENV, str(config))
    monkeypatch.setenv(ports.SECRETS_DIR_ENV, str(secrets))
    kafka = load_settings(KafkaSettings, "kafka")
    props = run_script(config, secrets, tmp_path)
    # the same protocol the services connect with, and (SASL) the same mechanism and credentials
    assert props["security.protocol"] == kafka.security_protocol == protocol
    if mechanism is None:
        assert set(props) == {"security.protocol"}
        return
    assert props["sasl.mechanism"] == kafka.sasl_mechanism == mechanism
    jaas = props["sasl.jaas.config"].replace("\\\\", "\\")  # the .properties escaping undone
    assert f'username="{kafka.sasl_plain_username}"' in jaas
    assert 'password="p\\"w\\\\1"' in jaas  # JAAS-escaped: a quote or backslash cannot end the value
    module = "scram.ScramLoginModule" if mechanism.startswith("SCRAM") else "plain.PlainLoginModule"
    assert module in jaas
    if protocol.endswith("SSL"):  # the brokers are verified against the same CA file
        assert props["ssl.truststore.type"] == "PEM" and props["ssl.truststore.location"] == str(kafka.ssl_cafile)
