"""``lookahead-rag serve {retriever|draftcache|generator|all}``: run the services as gRPC servers.

Each service binds its settings' ``host:port`` (``--port`` overrides a single service's port) and
serves Prometheus metrics on ``host:metrics_port`` unless that is unset (None). ``all`` runs the
three in one process with the in-process event bus, or Kafka with ``--kafka HOST:PORT`` (or
LAR_KAFKA_BOOTSTRAP_SERVERS); there each configured metrics port serves the whole process's
metrics, so scrape one of them. A single service needs Kafka to receive events from the others;
its Kafka state (consumer snapshot + offsets, the generator's outbox) lives under its own data_dir.
Logging follows the ``[logging]`` settings (LAR_LOG_LEVEL, LAR_LOG_FORMAT). SIGINT/SIGTERM stop
gracefully (each server's shutdown_grace_s) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from services.app import AllSettings, Pipeline
from services.common.settings import ConfigError, LoggingSettings, ServerSettings, load_settings

log = logging.getLogger("lookahead_rag.serve")
SERVICES = ("retriever", "draftcache", "generator", "all")
Stopper = Callable[[], Awaitable[Any]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("service", choices=SERVICES)
    p.add_argument("--config", default=None, help="TOML configuration file (else $LAR_CONFIG)")
    p.add_argument("--kafka", default=None, help="Kafka bootstrap HOST:PORT (default: in-process bus)")
    p.add_argument("--port", type=int, default=None, help="gRPC port of a single service (else its settings')")
    p.add_argument("--text-logs", action="store_true", help="human-readable logs instead of JSON")
    return p.parse_args(argv)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def start_exporter(name: str, settings: ServerSettings, registry: CollectorRegistry) -> Stopper | None:
    """Serve ``registry`` on the service's metrics port (None: off); returns its stopper."""
    from services.common.metrics import start_metrics_server, stop_metrics_server

    if settings.metrics_port is None:
        return None
    port = start_metrics_server(settings.metrics_port, registry, settings.host)
    log.info("%s metrics on http://%s:%d/metrics", name, settings.host, port)

    async def stop() -> None:
        stop_metrics_server(port)

    return stop


def bus_dir(name: str, data_dir: Path | None) -> Path:
    """Where a service's Kafka state lives: its data_dir, or a fresh temp dir when it keeps nothing."""
    if data_dir is not None:
        return Path(data_dir)
    return Path(tempfile.mkdtemp(prefix=f"lookahead-rag-{name}-bus-"))


async def _serve_one(name: str, settings: AllSettings, port: int | None) -> None:
    from services.common.grpcutil import open_channel, start_server, stop_server
    from services.common.kafka_settings import DRAFTCACHE_GROUP, RETRIEVER_GROUP, make_bus
    from services.common.metrics import (
        ConsumerMetrics,
        DraftCacheMetrics,
        GeneratorMetrics,
        ObservabilityInterceptor,
        ObservedApplier,
        OutboxMetrics,
        Refresher,
        consumer_jobs,
        outbox_job,
    )

    registry = REGISTRY  # one service per process: the default registry, with process and GC metrics
    interceptors = [ObservabilityInterceptor(registry)]
    consumers = ConsumerMetrics.of(registry)
    own: ServerSettings = getattr(settings, name)
    stoppers: list[Stopper] = []
    if name == "retriever":
        from services.retriever.core import RetrieverCore
        from services.retriever.servicer import serve

        rs = settings.retriever
        bus = make_bus(settings.kafka, bus_dir(name, rs.data_dir))
        core = await asyncio.to_thread(RetrieverCore, rs)
        server, bound = await serve(core, port=port, interceptors=interceptors)
        bus.subscribe(RETRIEVER_GROUP, ObservedApplier(core.sessions, RETRIEVER_GROUP, consumers))
        refresher = Refresher(rs.metrics_refresh_s, consumer_jobs(bus, [RETRIEVER_GROUP], consumers))
        stoppers = [lambda: stop_server(server, rs.shutdown_grace_s), lambda: asyncio.to_thread(core.close)]
    elif name == "draftcache":
        from services.draftcache.servicer import serve

        ds = settings.draftcache
        bus = make_bus(settings.kafka, bus_dir(name, ds.data_dir))
        service = await serve(ds, port=port, interceptors=interceptors, metrics=DraftCacheMetrics.of(registry))
        bound = service.port
        meter = service.meter
        assert meter is not None
        bus.subscribe(DRAFTCACHE_GROUP, meter.applier(consumers))
        refresher = Refresher(ds.metrics_refresh_s,
                              [meter.refresh_sizes, *consumer_jobs(bus, [DRAFTCACHE_GROUP], consumers)])
        stoppers = [lambda: service.stop(ds.shutdown_grace_s)]
    else:
        from lookahead_core import load_model
        from lookahead_rag.v1 import generator_pb2_grpc

        from services.common.ports import DRAFTCACHE_GRPC_PORT, RETRIEVER_GRPC_PORT
        from services.generator.clients import GrpcDraftClient, GrpcRetrieverClient
        from services.generator.engine import GeneratorEngine
        from services.generator.servicer import SERVICE_NAME, GeneratorServicer

        gs = settings.generator
        bus = make_bus(settings.kafka, bus_dir(name, gs.data_dir))
        model, tok = await asyncio.to_thread(load_model, gs.model)
        rch = open_channel(gs.retriever_target or f"127.0.0.1:{RETRIEVER_GRPC_PORT}", gs.max_message_bytes)
        dch = open_channel(gs.draftcache_target or f"127.0.0.1:{DRAFTCACHE_GRPC_PORT}", gs.max_message_bytes)
        engine = GeneratorEngine(gs, model, tok, GrpcRetrieverClient(rch), GrpcDraftClient(dch), bus,
                                 metrics=GeneratorMetrics.of(registry))
        server, bound = await start_server(
            [(generator_pb2_grpc.add_GeneratorServicer_to_server, GeneratorServicer(engine))], [SERVICE_NAME],
            port=gs.port if port is None else port, host=gs.host, max_message_bytes=gs.max_message_bytes,
            interceptors=interceptors)
        refresher = Refresher(gs.metrics_refresh_s)
        if settings.kafka.enabled:
            refresher.add(outbox_job(bus, OutboxMetrics.of(registry)))
        stoppers = [lambda: stop_server(server, gs.shutdown_grace_s), rch.close, dch.close]
    await bus.start()
    await refresher.start()
    exporter = start_exporter(name, own, registry)
    print(f"{name} serving on {own.host}:{bound} (Ctrl-C to stop)", flush=True)
    await _wait_for_signal()
    log.info("%s stopping", name)
    if exporter is not None:
        stoppers.insert(0, exporter)
    await refresher.stop()
    for stop in stoppers:
        await stop()
    await bus.stop()


async def _serve_all(settings: AllSettings) -> None:
    pipeline = await Pipeline.start(settings, grpc_servers=True, registry=REGISTRY)
    exporters: list[Stopper] = []
    seen: set[tuple[str, int]] = set()
    for name in ("retriever", "draftcache", "generator"):
        own: ServerSettings = getattr(settings, name)
        if own.metrics_port is None or (own.host, own.metrics_port) in seen:
            continue
        seen.add((own.host, own.metrics_port))
        exporter = start_exporter(name, own, pipeline.registry)
        if exporter is not None:
            exporters.append(exporter)
    ports = ", ".join(f"{k} {getattr(settings, k).host}:{v}" for k, v in pipeline.ports.items())
    print(f"serving {ports} (Ctrl-C to stop)", flush=True)
    await _wait_for_signal()
    log.info("stopping")
    for stop in exporters:
        await stop()
    await pipeline.stop()


def main(argv: list[str] | None = None) -> int:
    from services.common.logging import setup_logging

    args = parse_args(argv or [])
    overrides: dict[str, dict[str, Any]] = {}
    if args.kafka:
        overrides["kafka"] = {"bootstrap_servers": args.kafka}
    try:
        logging_settings = load_settings(LoggingSettings, "logging", args.config)
        settings = AllSettings.load(args.config, **overrides)
    except ConfigError as exc:
        print(f"lookahead-rag serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(logging_settings.level, json=logging_settings.format == "json" and not args.text_logs)
    if args.service == "all":
        asyncio.run(_serve_all(settings))
    else:
        asyncio.run(_serve_one(args.service, settings, args.port))
    return 0
