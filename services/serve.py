"""``lookahead-rag serve {retriever|draftcache|generator|all}``: run the services as gRPC servers.

Each service binds its settings' ``host:port`` (``--port`` overrides a single service's port) and
serves Prometheus metrics on ``host:metrics_port`` unless that is unset (None). ``all`` runs the
three in one process with the in-process event bus, or Kafka with ``--kafka HOST:PORT`` (or
LAR_KAFKA_BOOTSTRAP_SERVERS); there each configured metrics port serves the whole process's
metrics, so scrape one of them. A single service needs Kafka to receive events from the others;
its Kafka state (consumer snapshot + offsets, the generator's outbox) lives under its own data_dir.
Logging follows the ``[logging]`` settings (LAR_LOG_LEVEL, LAR_LOG_FORMAT). SIGINT/SIGTERM stop
gracefully and the process exits 0: every gRPC server's health reports NOT_SERVING at once and it
keeps serving for its ``drain_s`` (readiness fails, balancers move away; the HTTP endpoint serves
on meanwhile), then the HTTP endpoint and the servers refuse new calls and in-flight ones get
their ``shutdown_grace_s``; then the bus drains and state is saved.

Transport security follows ``[tls]`` (services.common.auth.tls): without a server certificate, a host
other than loopback is refused (exit 2) unless ``allow_insecure = true``, which logs a warning; so is
one with ``[auth] mode = "off"``, TLS or not, unless ``[auth] allow_unauthenticated = true`` (a warning).
Traces go to ``[tracing] otlp_endpoint`` (or $OTEL_EXPORTER_OTLP_ENDPOINT) when one is set
(services.common.telemetry.tracing); the HTTP endpoint also serves the process's metrics at /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from lookahead_rag.services.common.ports import SERVICES
from lookahead_rag.services.common.service import graceful_stop
from lookahead_rag.services.common.settings import ConfigError, LoggingSettings, ServerSettings, load_settings
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.common.telemetry.logs import setup_logging
from lookahead_rag.services.common.telemetry.observability import start_metrics_server, stop_metrics_server
from lookahead_rag.services.config import AllSettings

log = logging.getLogger("lookahead_rag.serve")
CHOICES = (*SERVICES, "all")
Stopper = Callable[[], Awaitable[Any]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("service", choices=CHOICES)
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
    if settings.metrics_port is None:
        return None
    port = start_metrics_server(settings.metrics_port, registry, settings.host)
    log.info("%s metrics on http://%s:%d/metrics", name, settings.host, port)

    async def stop() -> None:
        stop_metrics_server(port)

    return stop


async def serve(names: tuple[str, ...], settings: AllSettings, port: int | None) -> None:
    """Run ``names`` as gRPC servers until SIGINT/SIGTERM, then stop gracefully."""
    from lookahead_rag.services.app import Pipeline  # torch: only once the arguments are parsed (--help stays light)

    bind = {} if port is None else {names[0]: port}
    pipeline = await Pipeline.start(settings, names, grpc_servers=True, bind=bind, registry=REGISTRY)
    exporters: list[Stopper] = []
    seen: set[tuple[str, int]] = set()
    for name in names:
        own: ServerSettings = getattr(settings, name)
        if own.metrics_port is None or (own.host, own.metrics_port) in seen:
            continue  # under `serve all` each configured port serves the whole process: once is enough
        seen.add((own.host, own.metrics_port))
        exporter = start_exporter(name, own, pipeline.registry)
        if exporter is not None:
            exporters.append(exporter)
    ports = ", ".join(f"{k} {getattr(settings, k).host}:{v}" for k, v in pipeline.ports.items())
    if pipeline.http_port is not None:
        scheme = "https" if settings.tls.server_enabled else "http"
        ports += f", http {scheme}://{settings.http.host}:{pipeline.http_port}/v1 (the chat page: /)"
    print(f"serving {ports} (Ctrl-C to stop)", flush=True)
    await _wait_for_signal()
    log.info("stopping %s", ", ".join(names))

    async def stop_all() -> None:
        await pipeline.stop()
        for stop in exporters:  # last: /metrics stays scrapeable while the services drain and stop
            await stop()

    await graceful_stop(list(pipeline.services.values()), stop_all)


def main(argv: list[str] | None = None) -> int:
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
    names = SERVICES if args.service == "all" else (args.service,)
    try:
        asyncio.run(serve(names, settings, args.port))
    except ConfigError as exc:  # e.g. [tls]: plaintext beyond loopback, an unreadable certificate
        print(f"lookahead-rag serve: {exc}", file=sys.stderr)
        return 2
    finally:
        tracing.shutdown()  # [tracing]: export the spans still batched (nothing when tracing is off)
    return 0
