"""The Grafana dashboard and its provisioning, statically (Docker does not run here): every metric a
panel queries is one the code registers, and docker-compose.yml's grafana service loads it all."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.telemetry.metric_group import MetricGroup
from lookahead_rag.services.common.telemetry.observability import RpcMetrics
from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
from lookahead_rag.services.events.metrics import ConsumerMetrics, OutboxMetrics
from lookahead_rag.services.generator.metrics import GeneratorMetrics, RequestMetrics
from lookahead_rag.services.http.metrics import HttpMetrics
from tests.services.deploy_helpers import DEPLOY, compose

GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "lookahead-rag.json"
METRIC = re.compile(r"\blookahead_rag_[a-zA-Z0-9_]+")
# family type -> the series names it exports (a counter's _created series is never queried)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
            "summary": ("_sum", "_count")}
GROUPS: tuple[type[MetricGroup], ...] = (RpcMetrics, HttpMetrics, GeneratorMetrics, RequestMetrics, DraftCacheMetrics,
                                         ConsumerMetrics, OutboxMetrics)


def registered_names() -> set[str]:
    """Every series name the services' metric groups can export (built in a registry of their own)."""
    registry = CollectorRegistry()
    for group in GROUPS:
        group.of(registry)
    names = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def exprs(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets (rows' nested panels too) and variables."""
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        yield query["query"] if isinstance(query, dict) else str(query)


def provisioning(kind: str) -> dict[str, Any]:
    (path,) = (GRAFANA / "provisioning" / kind).glob("*.yml")
    return yaml.safe_load(path.read_text())


def test_every_metric_the_dashboard_queries_is_registered() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for expr in exprs(dashboard) for name in METRIC.findall(expr)}
    # it queries the request metrics by vLLM's names, the speculation counters, HTTP and gRPC
    assert {"lookahead_rag_e2e_request_latency_seconds_bucket", "lookahead_rag_time_to_first_token_seconds_bucket",
            "lookahead_rag_inter_token_latency_seconds_bucket", "lookahead_rag_request_queue_time_seconds_bucket",
            "lookahead_rag_spec_decode_num_accepted_tokens_total", "lookahead_rag_spec_decode_num_draft_tokens_total",
            "lookahead_rag_http_requests_total"} <= used
    assert sorted(used - registered_names()) == []


def test_the_check_catches_an_unknown_metric() -> None:
    # a misspelt name (or one registered nowhere) is reported
    used = set(METRIC.findall("rate(lookahead_rag_e2e_request_latency_second_bucket[5m])"))
    assert used - registered_names() == {"lookahead_rag_e2e_request_latency_second_bucket"}


def test_panels_use_the_provisioned_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (source,) = provisioning("datasources")["datasources"]
    # the Prometheus service of the compose file, under the uid every panel names
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    prometheus = compose()["services"]["prometheus"]
    assert any(p.endswith(":9090") for p in prometheus["ports"])
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]}


def test_compose_grafana_mounts_the_provisioning_and_the_dashboards() -> None:
    grafana = compose()["services"]["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    mounts = {}
    for volume in grafana["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    # provisioning (datasource + dashboard provider) and the directory the provider reads
    assert (DEPLOY / mounts["/etc/grafana/provisioning"]).resolve() == (GRAFANA / "provisioning").resolve()
    (provider,) = provisioning("dashboards")["providers"]
    dashboards_in = provider["options"]["path"]
    assert (DEPLOY / mounts[dashboards_in]).resolve() == DASHBOARD.parent.resolve()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert PurePosixPath(home).parent == PurePosixPath(dashboards_in)
    assert (DASHBOARD.parent / PurePosixPath(home).name).exists()
    # published on this machine only, like the rest of the stack
    assert all(str(p).startswith("127.0.0.1:") for p in grafana["ports"])
