"""Metrics and logs wired into the running services: a real answer moves the issue-5 metrics.

- in-process (Pipeline without gRPC, the demo's set-up): generator, draft cache and consumer
  metrics move, served over HTTP from the pipeline's own registry;
- through the three gRPC servers: calls counted by method and status (a refused request shows up
  with INVALID_ARGUMENT), and every log line of one request carries its request id and tenant,
  never the question or answer text at INFO;
- ``lookahead-rag serve all`` as a subprocess on free ports: ingest through the retriever's Ingest
  RPC, one answer, each service's /metrics over HTTP, SIGTERM exits 0.

Counts are exact (one answer each); nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER, setup_logging
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.generator.convert import answer_query
from lookahead_rag.services.generator.domain import FinalInfo
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from tests.kafka.helpers import fast_settings, new_topic
from tests.logcapture import json_lines, json_logs
from tests.pipeline.helpers import (
    CALL_TIMEOUT_S,
    DOCS,
    QUESTION,
    RunningPipeline,
    collect,
    module_loop,
    module_pipeline,
    pipeline_settings,
    rpc_error,
    shared_model,
    unique_tenant,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 24
ANSWER = "/lookahead_rag.v1.Generator/Answer"
RETRIEVE = "/lookahead_rag.v1.Retriever/Retrieve"
INGEST = "/lookahead_rag.v1.Retriever/Ingest"
FETCH = "/lookahead_rag.v1.DraftCache/Fetch"
STARTUP_TIMEOUT_S = 600.0  # serve all loads the model and the embedder on 2 shared cores
METRICS_WAIT_S = 120.0  # sampled gauges refresh every LAR_*_METRICS_REFRESH_S (0.2 s in the subprocess)
EXIT_TIMEOUT_S = 180.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((f"lookahead_rag_{name}", tuple(sorted(labels.items()))), 0.0)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"lookahead_rag_{name}", labels) or 0.0


def calls(registry: CollectorRegistry, method: str, code: str = "OK") -> float:
    return value(registry, "rpc_requests_total", method=method, code=code)


def answer_request(tenant: str, question: str = QUESTION) -> generator_pb2.AnswerRequest:
    return generator_pb2.AnswerRequest(tenant=tenant, question=question,
                                       params=generator_pb2.GenerationParams(max_new_tokens=MAX_NEW))


pipe = module_pipeline()  # the three gRPC servers, shared by the tests of this module


# --- in-process: the embedded default --------------------------------------------------------------


@module_loop
async def test_in_process_pipeline_metrics_move_after_an_answer(tmp_path: Path, pipe: RunningPipeline) -> None:
    """Exact counts of this pipeline's one answer, while another pipeline (``pipe``) in the same
    process answers too: each has its own registry."""
    model, tokenizer = shared_model()
    pipeline = await Pipeline.start(pipeline_settings(tmp_path), model=model, tokenizer=tokenizer, metrics_port=0)
    try:
        assert pipeline.metrics_port and not pipeline.ports
        tenant = unique_tenant("in-process")
        pipeline.retriever.ingest(tenant, DOCS)
        before = scrape(pipeline.metrics_port)
        assert sample(before, "generator_new_tokens_total") == 0
        assert sample(before, "generator_draft_source_hits_total", source="prompt") == 0  # exported at 0

        final = None
        async for chunk in pipeline.generator.answer(answer_query(answer_request(tenant))):
            final = chunk if isinstance(chunk, FinalInfo) else final
        assert final is not None
        await collect(pipe.stub.Answer(answer_request(pipe.new_tenant("neighbour")), timeout=CALL_TIMEOUT_S))
        await pipeline.bus.drain(60)
        pipeline.refresh_metrics()
        after = scrape(pipeline.metrics_port)
        forwards = pipeline.generator.scheduler.state().forwards
    finally:
        await pipeline.stop()
    stats = final.stats
    assert stats.new_tokens > 0
    assert sample(after, "generator_new_tokens_total") == stats.new_tokens
    assert sample(after, "generator_forward_steps_total") == stats.forward_steps
    assert sample(after, "generator_accepted_tokens_per_step_count") == stats.forward_steps
    assert sample(after, "generator_accepted_tokens_per_step_sum") == stats.new_tokens - 1  # not the prefill's
    assert sample(after, "generator_time_to_first_token_seconds_count") == 1
    assert sample(after, "generator_tokens_per_second_count") == 1
    assert sample(after, "generator_draft_source_hits_total", source="prompt") == stats.draft_tokens_from_prompt
    assert sample(after, "generator_tokens_per_forward_count") == forwards > stats.forward_steps  # + the prefill
    assert sample(after, "generator_draft_budget_tokens_count") == stats.forward_steps  # one budget per step
    assert sample(after, "generator_prefix_cache_hit_tokens_total") == stats.prefix_hit_tokens == 0
    assert sample(after, "draftcache_fetch_latency_seconds_count") == 1
    for consumer in ("draftcache", "retriever"):
        assert sample(after, "consumer_applied_events_total", consumer=consumer) == 1, consumer
        assert sample(after, "consumer_event_age_seconds_count", consumer=consumer) == 1, consumer
        assert sample(after, "consumer_lag_events", consumer=consumer) == 0, consumer
        assert sample(after, "consumer_dead_lettered_events_total", consumer=consumer) == 0, consumer
    assert sample(after, "draftcache_trie_nodes", tenant=tenant) > 0
    assert sample(after, "draftcache_trie_bytes", tenant=tenant) > 0
    assert not any(name == "lookahead_rag_rpc_requests_total" for name, _ in after)  # no gRPC in-process


def test_trie_sizes_are_measured_only_for_tenants_that_changed() -> None:
    """Cheap by construction: an applied event marks its tenant; a refresh measures only marked ones."""
    from lookahead_rag.services.draftcache.meter import StoreMeter
    from lookahead_rag.services.draftcache.metrics import DraftCacheMetrics
    from lookahead_rag.services.draftcache.store import DraftCacheStore
    from lookahead_rag.services.events.metrics import ConsumerMetrics
    from tests.builders import completed
    from tests.services.draftcache_helpers import small_settings, store_with

    registry = CollectorRegistry()
    store = store_with([("acme", [1, 2, 3, 4, 5]), ("beta", [6, 7, 8])])
    meter = StoreMeter(store, DraftCacheMetrics.of(registry))
    applier = meter.applier(ConsumerMetrics.of(registry))
    assert meter.refresh_sizes() == 2  # a store that starts with tenants: all measured once
    nodes = value(registry, "draftcache_trie_nodes", tenant="acme")
    assert nodes == store.stats("acme")[0].nodes > 0
    assert meter.refresh_sizes() == 0  # nothing changed: no trie is walked
    assert applier.apply(completed("acme", event_id="e9", output_ids=[9, 10, 11, 12]))
    duplicate = completed("acme", event_id="e9", output_ids=[9, 10, 11, 12])
    assert not applier.apply(duplicate)  # a duplicate changes nothing
    assert meter.refresh_sizes() == 1
    assert value(registry, "draftcache_trie_nodes", tenant="acme") == store.stats("acme")[0].nodes > nodes
    assert value(registry, "consumer_event_age_seconds_count", consumer="draftcache") == 0  # no created time
    meter.fetch("acme", "tok-a", [1, 2, 3])
    assert value(registry, "draftcache_fetch_latency_seconds_count") == 1
    only_beta = DraftCacheStore(small_settings())
    only_beta.add_output("beta", "tok-a", [6, 7], "b1")
    applier.restore(only_beta.snapshot())  # a consumer restoring a snapshot replaces everything
    assert meter.refresh_sizes() == 2
    assert registry.get_sample_value("lookahead_rag_draftcache_trie_nodes", {"tenant": "acme"}) is None
    assert value(registry, "draftcache_trie_nodes", tenant="beta") == store.stats("beta")[0].nodes


def test_outbox_job_samples_depth_and_acknowledged_events() -> None:
    from types import SimpleNamespace

    from lookahead_rag.services.events import BusStats, OutboxStats
    from lookahead_rag.services.events.metrics import OutboxMetrics, outbox_job

    registry = CollectorRegistry()
    counters = SimpleNamespace(sent=0)
    bus = SimpleNamespace(depth=3, stats=lambda: BusStats(outbox=OutboxStats(depth=bus.depth, sent=counters.sent)))
    job = outbox_job(bus, OutboxMetrics.of(registry))
    job()
    assert (value(registry, "outbox_depth"), value(registry, "outbox_sent_events_total")) == (3, 0)
    bus.depth, counters.sent = 1, 2
    job()
    assert (value(registry, "outbox_depth"), value(registry, "outbox_sent_events_total")) == (1, 2)


@pytest.mark.kafka
@pytest.mark.timeout(600)
@pytest.mark.asyncio  # a loop of its own: this test starts its own pipeline
async def test_kafka_pipeline_metrics_come_from_the_kafka_bus(tmp_path: Path, broker: LocalBroker) -> None:
    """With Kafka: the outbox and both Kafka consumers feed the pipeline's metrics."""
    model, tokenizer = shared_model()
    kafka = fast_settings(broker.bootstrap, new_topic()).model_dump()
    pipeline = await Pipeline.start(pipeline_settings(tmp_path, kafka=kafka), model=model, tokenizer=tokenizer)
    try:
        tenant = unique_tenant("kafka")
        pipeline.retriever.ingest(tenant, DOCS)
        async for _chunk in pipeline.generator.answer(answer_query(answer_request(tenant))):
            pass
        await pipeline.bus.drain(120)
        pipeline.refresh_metrics()
        registry = pipeline.registry
    finally:
        await pipeline.stop()
    assert value(registry, "outbox_sent_events_total") == 1
    assert value(registry, "outbox_depth") == 0
    for consumer in ("draftcache", "retriever"):
        assert value(registry, "consumer_applied_events_total", consumer=consumer) == 1, consumer
        assert value(registry, "consumer_lag_events", consumer=consumer) == 0, consumer
    assert value(registry, "draftcache_trie_nodes", tenant=tenant) > 0


# --- through the gRPC servers ------------------------------------------------------------------------


@module_loop
async def test_grpc_calls_are_counted_by_method_and_status(pipe: RunningPipeline) -> None:
    registry = pipe.pipeline.registry
    tenant = pipe.new_tenant("grpc-metrics")
    counted = {(m, c): calls(registry, m, c) for m in (ANSWER, RETRIEVE, FETCH) for c in ("OK", "INVALID_ARGUMENT")}
    tokens_before = value(registry, "generator_new_tokens_total")
    got = await collect(pipe.stub.Answer(answer_request(tenant), timeout=CALL_TIMEOUT_S))
    err = await rpc_error(lambda: collect(pipe.stub.Answer(answer_request(tenant, question="  "),
                                                           timeout=CALL_TIMEOUT_S)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await wait_until(lambda: calls(registry, ANSWER, "INVALID_ARGUMENT") > counted[ANSWER, "INVALID_ARGUMENT"],
                            60)

    def moved(method: str, code: str = "OK") -> float:
        return calls(registry, method, code) - counted[method, code]

    assert await wait_until(lambda: moved(ANSWER) == 1, 60)  # recorded once the stream has closed on the server
    assert (moved(ANSWER), moved(RETRIEVE), moved(FETCH)) == (1, 1, 1)
    assert (moved(ANSWER, "INVALID_ARGUMENT"), moved(RETRIEVE, "INVALID_ARGUMENT")) == (1, 0)  # refused up front
    for method in (ANSWER, RETRIEVE, FETCH):
        assert value(registry, "rpc_latency_seconds_count", method=method, code="OK") >= 1, method
        assert value(registry, "rpc_in_flight", method=method) == 0, method
    assert value(registry, "generator_new_tokens_total") - tokens_before == got.final.stats.new_tokens > 0
    assert value(registry, "draftcache_fetch_latency_seconds_count") >= 1  # the servicer path is metered too


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    with json_logs() as stream:
        yield stream


lines_of = json_lines


@module_loop
async def test_every_log_line_of_a_request_has_its_id_and_tenant_and_no_text_at_info(
        pipe: RunningPipeline, log_stream: io.StringIO) -> None:
    tenant = pipe.new_tenant("logs")
    log_stream.seek(0)
    log_stream.truncate()
    rid = "req-ops-wiring-1"
    got = await collect(pipe.stub.Answer(answer_request(tenant), metadata=((REQUEST_ID_HEADER, rid),),
                                         timeout=CALL_TIMEOUT_S))
    assert await wait_until(lambda: any(x["msg"].startswith(ANSWER) for x in lines_of(log_stream)), 60)
    lines = lines_of(log_stream)
    text = log_stream.getvalue()
    assert got.final.request_id == rid  # the caller's id is the request's id end to end
    assert lines and all((x["request_id"], x["tenant"]) == (rid, tenant) for x in lines), lines
    messages = [x["msg"] for x in lines]
    for method in (RETRIEVE, FETCH, ANSWER):  # each service logged the call, under the caller's id
        assert any(m.startswith(f"{method} OK") for m in messages), (method, messages)
    assert any(m.startswith("answered:") for m in messages), messages
    assert len(got.final.answer_text) > 20
    assert got.final.answer_text not in text and QUESTION not in text
    assert all(x["level"] != "DEBUG" for x in lines)


@module_loop
async def test_answer_text_is_logged_at_debug_only(pipe: RunningPipeline, log_stream: io.StringIO) -> None:
    """The check above can fail: at DEBUG the same request does log its answer."""
    setup_logging("DEBUG", stream=log_stream)
    tenant = pipe.new_tenant("debug-logs")
    rid = "req-ops-wiring-debug"
    got = await collect(pipe.stub.Answer(answer_request(tenant), metadata=((REQUEST_ID_HEADER, rid),),
                                         timeout=CALL_TIMEOUT_S))
    assert await wait_until(lambda: any(x["msg"].startswith(ANSWER) for x in lines_of(log_stream)), 60)
    debug = [x for x in lines_of(log_stream) if x["level"] == "DEBUG" and x["request_id"] == rid]
    assert any(got.final.answer_text in x["msg"] for x in debug)
    assert all(x["tenant"] == tenant for x in debug)


# --- lookahead-rag serve all, as an operator runs it ------------------------------------------------


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def serving(port: int) -> bool:
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = health_pb2.HealthCheckRequest(service="")
            status = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
            return status.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


@pytest.mark.asyncio  # a loop of its own: the services run in a subprocess
async def test_serve_all_exposes_metrics_per_service_and_stops_on_sigterm(tmp_path: Path) -> None:
    grpc_ports = dict(zip(("retriever", "draftcache", "generator"), free_ports(3), strict=True))
    metrics_ports = dict(zip(("retriever", "draftcache", "generator"), free_ports(3), strict=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAR_")}
    env.update(HF_HUB_OFFLINE="1", LAR_KAFKA_BOOTSTRAP_SERVERS="", LAR_LOG_LEVEL="INFO", LAR_HTTP_PORT="0")
    # No start-up kernel timing (minutes on a loaded 2-core box) nor timing-sized drafts: not this test's subject.
    env.update(LAR_GENERATOR_CALIBRATE_KERNELS="false", LAR_GENERATOR_ADAPTIVE_SPECULATION="false")
    for name in grpc_ports:
        prefix = f"LAR_{name.upper()}_"
        env.update({prefix + "PORT": str(grpc_ports[name]), prefix + "METRICS_PORT": str(metrics_ports[name]),
                    prefix + "DATA_DIR": str(tmp_path / name), prefix + "METRICS_REFRESH_S": "0.2"})
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "lookahead_rag.services.cli", "serve", "all"], cwd=REPO, env=env,
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:

        async def exited_or_serving() -> bool:
            if proc.poll() is not None:
                return True
            for port in grpc_ports.values():
                if not await serving(port):
                    return False
            return True

        up = await wait_until(exited_or_serving, STARTUP_TIMEOUT_S)
        assert up and proc.poll() is None, log_path.read_text()[-4000:]
        tenant = unique_tenant("serve-all")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_ports['retriever']}") as channel:
            docs = [retriever_pb2.Document(id=d.id, title=d.title, text=d.text) for d in DOCS[:1]]
            ingested = await retriever_pb2_grpc.RetrieverStub(channel).Ingest(
                retriever_pb2.IngestRequest(tenant=tenant, documents=docs), timeout=CALL_TIMEOUT_S)
            assert ingested.chunks >= 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_ports['generator']}") as channel:
            got = await collect(generator_pb2_grpc.GeneratorStub(channel).Answer(answer_request(tenant),
                                                                                timeout=CALL_TIMEOUT_S))
        assert got.final.stats.new_tokens > 0

        def applied(samples: Samples) -> bool:
            return (sample(samples, "consumer_applied_events_total", consumer="draftcache") == 1
                    and sample(samples, "consumer_applied_events_total", consumer="retriever") == 1
                    and sample(samples, "draftcache_trie_nodes", tenant=tenant) > 0)

        assert await wait_until(lambda: applied(scrape(metrics_ports["draftcache"])), METRICS_WAIT_S)
        for name, port in metrics_ports.items():  # every configured port serves the process's metrics
            samples = scrape(port)
            assert sample(samples, "rpc_requests_total", method=INGEST, code="OK") == 1, name
            assert sample(samples, "rpc_requests_total", method=RETRIEVE, code="OK") == 1, name
            assert sample(samples, "rpc_requests_total", method=FETCH, code="OK") == 1, name
            assert sample(samples, "rpc_requests_total", method=ANSWER, code="OK") == 1, name
            assert sample(samples, "generator_new_tokens_total") == got.final.stats.new_tokens, name
            assert sample(samples, "draftcache_fetch_latency_seconds_count") == 1, name
            assert applied(samples), name
            assert any(key[0] == "process_cpu_seconds_total" for key in samples), name  # the default registry
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, EXIT_TIMEOUT_S) == 0, log_path.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    logged = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert any(x["msg"].startswith(f"{ANSWER} OK") and x["tenant"] == tenant for x in logged)
    assert got.final.answer_text not in log_path.read_text()  # INFO: no answer text
