"""``/metrics`` on the HTTP API port (the same registry as the metrics port), the HTTP request
metrics, and the vLLM-named request metrics a real answer moves (``lookahead_rag_e2e_request_latency_seconds``
and the rest, labelled with ``model_name``). Counts are exact; nothing depends on timing."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from typing import ClassVar

import httpx2
import pytest
import pytest_asyncio
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from lookahead_rag.services.common.auth.callers import Principal
from lookahead_rag.services.common.auth.scopes import Scope
from lookahead_rag.services.common.errors import Unauthenticated
from lookahead_rag.services.common.telemetry.observability import start_metrics_server
from lookahead_rag.services.generator.metrics import SPEC_SOURCES
from lookahead_rag.services.http.metrics import (
    UNMATCHED,
    HttpMetrics,
    HttpMetricsMiddleware,
    MetricsRoute,
)
from tests.http.helpers import ask, model, openai_client, raw_client
from tests.pipeline.helpers import QUESTION, RunningPipeline, module_loop, pipeline_settings

MAX_NEW = 8
CHAT = "/v1/chat/completions"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningPipeline]:
    """A pipeline with the HTTP endpoint and a metrics port serving its registry (stopped with it)."""
    p = await RunningPipeline.start(pipeline_settings(tmp_path_factory.mktemp("http-metrics")))
    p.pipeline.metrics_port = start_metrics_server(0, p.pipeline.registry)
    try:
        yield p
    finally:
        await p.stop()


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape_port(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return parse(response.read().decode())


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((f"lookahead_rag_{name}", tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == f"lookahead_rag_{name}")


@module_loop
async def test_metrics_on_the_api_port_and_request_metrics(pipe: RunningPipeline) -> None:
    tenant = pipe.new_tenant("http-metrics")
    completions, prompts = 0, 0
    async with openai_client(pipe, tenant) as client:
        for _ in range(2):
            got = await client.chat.completions.create(model=model(pipe), messages=ask(QUESTION), max_tokens=MAX_NEW)
            completions += got.usage.completion_tokens  # type: ignore[union-attr]
            prompts += got.usage.prompt_tokens  # type: ignore[union-attr]
    async with raw_client(pipe) as http:
        assert (await http.get("/no/such/path")).status_code == 404
        reply = await http.get("/metrics")
    # /metrics on the API port: Prometheus' text format
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    api = parse(reply.text)
    port = scrape_port(pipe.pipeline.metrics_port)  # type: ignore[arg-type]
    name = model(pipe)
    # the HTTP requests: by route template, method and status (an unknown path is "unmatched", never itself)
    assert get(api, "http_requests_total", route=CHAT, method="POST", status="200") == 2
    assert get(api, "http_requests_total", route=UNMATCHED, method="GET", status="404") == 1
    assert get(api, "http_request_duration_seconds_count", route=CHAT, method="POST") == 2
    assert get(api, "http_requests_in_flight", route=CHAT, method="POST") == 0
    assert not [k for k in api if "no/such" in str(k)]
    # the same registry on both ports: the request metrics agree, and the API port's own requests show on the port
    for metric in ("e2e_request_latency_seconds_count", "generation_tokens_total", "prompt_tokens_total",
                   "spec_decode_num_draft_tokens_total"):
        assert get(api, metric, model_name=name) == get(port, metric, model_name=name), metric
    assert get(port, "http_requests_total", route="/metrics", method="GET", status="200") == 1
    # vLLM's request metrics, labelled with the served model
    assert get(api, "e2e_request_latency_seconds_count", model_name=name) == 2
    assert get(api, "request_queue_time_seconds_count", model_name=name) == 2
    assert get(api, "time_to_first_token_seconds_count", model_name=name) == 2
    assert get(api, "request_prompt_tokens_count", model_name=name) == 2
    assert get(api, "generation_tokens_total", model_name=name) == completions
    assert get(api, "prompt_tokens_total", model_name=name) == prompts
    assert get(api, "request_generation_tokens_sum", model_name=name) == completions
    assert total(api, "request_success_total") == 2
    # inter-token latency: one observation per engine step; speculation: accepted tokens by source
    # add up to the tokens the steps emitted beyond their one each
    steps = get(api, "generator_forward_steps_total")
    assert get(api, "inter_token_latency_seconds_count", model_name=name) == steps
    accepted = sum(get(api, "spec_decode_num_accepted_tokens_total", model_name=name, source=s) for s in SPEC_SOURCES)
    emitted = get(api, "generator_accepted_tokens_per_step_sum") - get(api, "generator_accepted_tokens_per_step_count")
    assert accepted == emitted
    assert get(api, "spec_decode_num_draft_tokens_total", model_name=name) >= accepted


class KeyAuth:
    """An Authenticator stand-in: two keys, one with the admin scope."""

    required = True
    keys: ClassVar[dict[str, tuple[Scope, ...]]] = {"admin-key": (Scope.ADMIN,), "answer-key": (Scope.ANSWER,)}

    def authenticate(self, bearer: str | None, subject: str | None = None) -> Principal:
        token = (bearer or "").removeprefix("Bearer ")
        if token not in self.keys:
            raise Unauthenticated("unknown or revoked API key")
        return Principal(f"key {token}", frozenset({"*"}), frozenset(self.keys[token]))


def small_app(auth: KeyAuth | None) -> tuple[HttpMetricsMiddleware, CollectorRegistry]:
    registry = CollectorRegistry()
    api = FastAPI()

    @api.get("/v1/items/{item}")
    async def item(item: str) -> PlainTextResponse:
        if item == "boom":
            raise RuntimeError("boom")
        return PlainTextResponse(item)

    metrics = HttpMetrics.of(registry)
    return HttpMetricsMiddleware(MetricsRoute(api, registry, auth), metrics, api.router), registry  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_metrics_on_the_api_port_asks_for_an_admin_key_when_auth_is_on() -> None:
    app, _ = small_app(KeyAuth())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        # no key: 401; a key without admin: 403; an admin key: the metrics
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers={"authorization": "Bearer answer-key"})).status_code == 403
        ok = await http.get("/metrics", headers={"authorization": "Bearer admin-key"})
        assert ok.status_code == 200 and "lookahead_rag_http_requests_total" in ok.text


@pytest.mark.asyncio
async def test_request_metrics_label_routes_by_template_and_count_failures() -> None:
    app, registry = small_app(None)
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as http:
        assert (await http.get("/v1/items/a")).status_code == 200
        assert (await http.get("/v1/items/b")).status_code == 200
        assert (await http.get("/v1/items/boom")).status_code == 500
        assert (await http.request("BREW", "/v1/items/a")).status_code == 405
        assert (await http.get("/metrics")).status_code == 200  # auth off: open, as the metrics port is

    def count(route: str, method: str, status: str) -> float:
        labels = {"route": route, "method": method, "status": status}
        return registry.get_sample_value("lookahead_rag_http_requests_total", labels) or 0.0

    # two paths, one route template; an application error is a 500; an unknown method is OTHER
    assert count("/v1/items/{item}", "GET", "200") == 2
    assert count("/v1/items/{item}", "GET", "500") == 1
    assert count(UNMATCHED, "OTHER", "405") == 1
    assert count("/metrics", "GET", "200") == 1
