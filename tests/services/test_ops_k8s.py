"""deploy/, checked statically, part two (part one: test_ops_deploy.py): the topics created, the
Kubernetes workloads (ports, probes, budgets, per-replica state, traffic to ready pods only), and
the LAR_* settings that deploy/ and its docs name agree with the code's configuration."""

from __future__ import annotations

import copy
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from lookahead_core.defaults import DEFAULT_MODEL

from lookahead_rag.services.common import ports
from lookahead_rag.services.common.settings import ConfigError, load_settings
from lookahead_rag.services.config import SECTIONS
from lookahead_rag.services.config_cli import toml_value
from tests.services.deploy_helpers import (
    ALL_TOPICS,
    CONFIGMAP,
    DEPLOY,
    DOCUMENTS_DLT_TOPIC,
    IMAGE,
    K8S,
    MIN_INSYNC_REPLICAS,
    NAMESPACE,
    TOPIC_JOB,
    all_containers,
    all_lar_env,
    compose_env,
    compose_topics,
    configmap_data,
    configmap_toml,
    container,
    disruption_problems,
    documents,
    env_from_configmap,
    expected_ports,
    job_topics,
    k8s,
    k8s_docs,
    k8s_env,
    kafka_default,
    lists_unready_pods,
    pod_specs,
    section_fields,
    split_env,
    traffic_targets,
    workload,
)


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_topic_creation_matches_kafka_settings(where: str) -> None:
    kafka = SECTIONS["kafka"]()
    if where == "compose":
        topics, replication = compose_topics(), 1
    else:
        topics, replication = job_topics(), configmap_toml()["kafka"]["replication_factor"]
    # the event topics, the documents topic and their dead-letter topics, nothing else
    assert set(topics) == ALL_TOPICS and {kafka.topic, kafka.dlt_topic} <= ALL_TOPICS
    assert topics[kafka.topic].partitions == kafka.partitions
    assert topics[kafka.dlt_topic].partitions == kafka.dlt_partitions
    # documents are keyed by tenant like the events: the same partitioning
    assert topics[ports.DOCUMENTS_TOPIC].partitions == kafka.partitions
    assert topics[DOCUMENTS_DLT_TOPIC].partitions == kafka.dlt_partitions
    assert {t.replication for t in topics.values()} == {replication}
    # events are never compacted: the key is the tenant, compaction would keep one event per tenant
    assert {topics[t].configs["cleanup.policy"] for t in (kafka.topic, kafka.dlt_topic)} == {"delete"}
    assert int(topics[kafka.topic].configs["retention.ms"]) > 0  # the caches are bounded anyway
    # new retriever replicas rebuild every document from the documents topic: its latest change may never
    # expire, and compaction (the key is ["tenant","doc_id"]) drops a replaced or deleted document's text
    documents = topics[ports.DOCUMENTS_TOPIC].configs
    assert documents["cleanup.policy"] == "compact" and "retention.ms" not in documents
    if where == "k8s":
        assert {t.configs["min.insync.replicas"] for t in topics.values()} == {str(MIN_INSYNC_REPLICAS)}


def consumers() -> list[str]:
    """The services that consume a topic (a per-replica LAR_KAFKA_*_GROUP or LAR_KAFKA_REPLICA_ID)."""
    per_replica = ("_GROUP", "_REPLICA_ID")
    return [s for s in ports.SERVICES
            if any(k.startswith("LAR_KAFKA_") and k.endswith(per_replica) for k in k8s_env(s))]


def test_k8s_consumers_wait_for_the_topic_job() -> None:
    assert consumers() == ["retriever", "draftcache"]
    data = configmap_data()
    # the list the consumers wait for is exactly what the Job creates, on the cluster the services use
    assert set(data["kafka-topics"].split()) == set(job_topics()) == ALL_TOPICS
    assert data["kafka-bootstrap"] == configmap_toml()["kafka"]["bootstrap_servers"]
    (job_container,) = k8s("Job", TOPIC_JOB)["spec"]["template"]["spec"]["containers"]
    assert env_from_configmap(job_container)["BOOTSTRAP"] == (CONFIGMAP, "kafka-bootstrap")
    for service in consumers():
        pod = workload(service)["spec"]["template"]["spec"]
        (wait,) = [c for c in pod.get("initContainers", []) if c["name"] == "wait-for-topics"]
        refs = env_from_configmap(wait)
        # it reads the same bootstrap and topic list, and loops until each topic can be described
        assert refs["BOOTSTRAP"] == (CONFIGMAP, "kafka-bootstrap") and refs["TOPICS"] == (CONFIGMAP, "kafka-topics")
        script = " ".join(wait["command"] + wait["args"])
        assert re.search(r"for (\w+) in \$TOPICS.*until \S*kafka-topics\.sh .*--describe --topic \"\$\1\"", script)
        assert wait["resources"]["limits"]["memory"], service
        # a read-only root needs a writable /tmp (the JVM, and LOG_DIR of kafka-run-class.sh)
        if wait["securityContext"].get("readOnlyRootFilesystem"):
            assert "/tmp" in {m["mountPath"] for m in wait["volumeMounts"]}
            assert {e["name"]: e.get("value") for e in wait["env"]}["LOG_DIR"].startswith("/tmp")


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
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == expected_ports(service)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # over TLS: test_ops_k8s_security.py
        assert str(grpc_port) in main[probe]["exec"]["command"], probe
    assert main["resources"]["requests"]["cpu"] and main["resources"]["requests"]["memory"]
    assert main["resources"]["limits"]["memory"]
    assert spec["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(metrics_port)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["enableServiceLinks"] is False
    assert k8s_env(service)["LAR_CONFIG"] == "/etc/lookahead-rag/config.toml"
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts["/etc/lookahead-rag"] == "config"
    service_doc = k8s("Service", service)
    assert {p["name"]: p["port"] for p in service_doc["spec"]["ports"]} == expected_ports(service)
    assert service_doc["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert all(doc["metadata"]["namespace"] == NAMESPACE for _, doc in k8s_docs() if doc["kind"] != "Namespace")


@pytest.mark.parametrize("service", ["retriever", "draftcache"])
def test_k8s_consumers_keep_state_per_replica(service: str) -> None:
    statefulset = k8s("StatefulSet", service)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(service)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == ports.DATA_DIR
    env = k8s_env(service)
    if service == "retriever":  # reads every partition itself; commits under <group>.<replica id> for lag only
        assert env["LAR_KAFKA_REPLICA_ID"] == "$(POD_NAME)" and "LAR_KAFKA_RETRIEVER_GROUP" not in env
    else:  # one consumer group per replica: each sees every event
        assert env[f"LAR_KAFKA_{service.upper()}_GROUP"].endswith(".$(POD_NAME)")
    assert k8s("Service", statefulset["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_every_k8s_container_is_bounded_and_unprivileged() -> None:
    specs = pod_specs(k8s_docs())
    assert len(specs) == len(ports.SERVICES) + 1  # the three workloads and the topic Job
    for where, pod in specs:
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        for c in all_containers(pod):  # init containers too (wait-for-topics)
            name = f"{where} {c['name']}"
            assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name


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
        host, _, port = config["generator"][field].removeprefix("dns:///").rpartition(":")
        assert host.split(".")[:2] == [upstream, NAMESPACE] and int(port) == ports.GRPC_PORTS[upstream]
        k8s("Service", upstream)
    assert config["kafka"]["bootstrap_servers"] == configmap_data()["kafka-bootstrap"]  # the Job's BOOTSTRAP
    for section in ("retriever", "draftcache"):
        assert config[section]["data_dir"].startswith(ports.DATA_DIR + "/")
    # the HTTP endpoint beside the generator, reachable from the generator Service
    assert config["http"]["port"] == ports.HTTP_PORT and config["http"]["host"] == "0.0.0.0"


def test_one_model_section_for_generator_and_retriever() -> None:
    config = configmap_toml()
    # [model] in the ConfigMap every pod reads: both services serve the same model
    assert set(config["model"]) == {"name", "device", "dtype"}
    # the image converts only the built-in model at build time and starts offline
    assert config["model"]["name"] == DEFAULT_MODEL
    retriever, generator = compose_env("retriever"), compose_env("generator")
    model_env = {k: v for k, v in generator.items() if k.startswith(ports.ENV_PREFIXES["model"])}
    assert model_env and model_env.items() <= retriever.items()  # compose: the same LAR_MODEL_* for both
    assert model_env[ports.ENV_PREFIXES["model"] + "NAME"] == DEFAULT_MODEL
    # the per-service model settings are gone: nothing in deploy/ names them any more
    texts = [path.read_text() for path in [*documents(), *DEPLOY.glob("*.yml"), *K8S.glob("*.yaml")]]
    for gone in ("LAR_GENERATOR_MODEL", "LAR_RETRIEVER_MODEL"):
        assert not any(gone in text for text in texts), gone


def test_no_traffic_goes_to_services_listing_unready_pods() -> None:
    docs = k8s_docs()
    targets = traffic_targets(docs)
    # the generator's upstreams are found as targets (the check is not vacuous)
    assert {"retriever", "draftcache"} <= set(targets)
    # no Service that publishes not-ready addresses is dialled from a ConfigMap, env, args or the docs
    unready = {doc["metadata"]["name"] for _, doc in docs if doc["kind"] == "Service" and lists_unready_pods(doc)}
    assert {name: targets[name] for name in unready & set(targets)} == {}
    # each StatefulSet's governing Service is headless (stable per-pod names)
    for _, doc in docs:
        if doc["kind"] == "StatefulSet":
            assert k8s("Service", doc["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_unready_service_check_catches_a_target() -> None:
    docs = copy.deepcopy(k8s_docs())
    (headless,) = [d for _, d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "retriever-headless"]
    headless["spec"]["publishNotReadyAddresses"] = True
    (configmap,) = [d for _, d in docs if d["kind"] == "ConfigMap"]
    configmap["data"]["config.toml"] = configmap["data"]["config.toml"].replace(
        '"dns:///retriever.lookahead-rag.svc:', '"dns:///retriever-headless.lookahead-rag.svc:')
    # the generator pointed at a Service listing unready pods is found (short names and pod names too)
    assert "ConfigMap/lookahead-rag-config[config.toml]" in traffic_targets(docs)["retriever-headless"]
    for text in ("retriever-headless:50051", "retriever-0.retriever-headless.lookahead-rag.svc:50051"):
        configmap["data"]["config.toml"] = f'x = "{text}"'
        assert "retriever-headless" in traffic_targets(docs), text


def test_replicated_and_stateful_workloads_have_a_disruption_budget() -> None:
    # retriever (2 replicas, a volume each), draft cache (a volume), generator (HPA min 2)
    assert disruption_problems(k8s_docs()) == []
    assert {doc["metadata"]["name"] for _, doc in k8s_docs() if doc["kind"] == "PodDisruptionBudget"} == set(
        ports.SERVICES)


def test_disruption_budget_check_catches_gaps() -> None:
    docs = [(n, d) for n, d in copy.deepcopy(k8s_docs())
            if not (d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "retriever")]
    # a missing PDB
    assert disruption_problems(docs) == ["StatefulSet/retriever: 0 PodDisruptionBudgets select it (want 1)"]
    (draft,) = [d for _, d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "draftcache"]
    del draft["spec"]["maxUnavailable"]
    draft["spec"]["minAvailable"] = 1  # one replica and minAvailable 1: no drain can ever evict it
    (generator,) = [d for _, d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "generator"]
    generator["spec"]["minAvailable"] = "0%"  # a drain may take every generator at once
    assert len(disruption_problems(docs)) == 3


def test_every_lar_variable_in_the_docs_names_a_real_field() -> None:
    for path in documents():
        for var in set(re.findall(r"\bLAR_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())):
            if var in (ports.CONFIG_ENV, ports.SECRETS_DIR_ENV) or var + "_" in ports.ENV_PREFIXES.values():
                continue
            section, field = split_env(var)
            assert field in section_fields(section), f"{path.name}: {var} sets no field of [{section}]"


def test_gpu_guide_names_only_real_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DEPLOY / "GPU.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    # the guide shows its settings as TOML, and they load into the real settings classes
    assert blocks
    for var in list(os.environ):
        if var.startswith("LAR_"):
            monkeypatch.delenv(var)
    for block in blocks:
        path = tmp_path / "gpu.toml"
        path.write_text(block)
        for section, table in tomllib.loads(block).items():
            unknown = sorted(set(table) - section_fields(section))
            assert not unknown, f"GPU.md [{section}]: {unknown} are not fields"
            loaded = load_settings(SECTIONS[section], section, path)
            assert {k: getattr(loaded, k) for k in table} == table
    assert 'device = "cuda"' in text and 'dtype = "bfloat16"' in text


def test_every_lar_variable_in_deploy_names_a_real_field() -> None:
    found = all_lar_env()
    assert len(found) > 20
    for where, var, _ in found:
        if var in (ports.CONFIG_ENV, ports.SECRETS_DIR_ENV):
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
        if var in (ports.CONFIG_ENV, ports.SECRETS_DIR_ENV):
            continue
        if split_env(var)[0] == section and split_env(var)[1] in cls.model_fields:
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
    assert str(ports.HTTP_PORT) in readme
    for text in [ports.EVENTS_TOPIC, ports.EVENTS_DLT_TOPIC, ports.DOCUMENTS_TOPIC, DOCUMENTS_DLT_TOPIC,
                 ports.CONFIG_ENV, ports.DATA_DIR, *ports.ENV_PREFIXES.values(), "CONFIG.md"]:
        assert text in readme, text
