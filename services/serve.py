"""``lookahead-rag serve {retriever|draftcache|generator|all}``: run the services as gRPC servers.

``all`` runs the three in one process on their standard ports (services.common.ports) with the
in-process event bus, or Kafka with ``--kafka HOST:PORT`` (or LAR_KAFKA_BOOTSTRAP_SERVERS). Each
single service needs Kafka to receive events from the others. SIGINT/SIGTERM stop gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

from services.app import AllSettings, Pipeline
from services.common.ports import DRAFTCACHE_GRPC_PORT, RETRIEVER_GRPC_PORT

log = logging.getLogger("lookahead_rag.serve")
SERVICES = ("retriever", "draftcache", "generator", "all")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lookahead-rag serve", description=__doc__)
    p.add_argument("service", choices=SERVICES)
    p.add_argument("--config", default=None, help="TOML configuration file (else $LAR_CONFIG)")
    p.add_argument("--kafka", default=None, help="Kafka bootstrap HOST:PORT (default: in-process bus)")
    p.add_argument("--port", type=int, default=None, help="gRPC port of a single service")
    p.add_argument("--text-logs", action="store_true", help="human-readable logs instead of JSON")
    return p.parse_args(argv)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_one(name: str, settings: AllSettings, port: int | None) -> None:
    from services.common.grpcutil import open_channel, stop_server
    from services.common.kafka_settings import DRAFTCACHE_GROUP, RETRIEVER_GROUP, make_bus

    data_dir = Path(settings.generator.data_dir)
    bus = make_bus(settings.kafka, data_dir)
    stoppers: list[Any] = []
    if name == "retriever":
        from services.retriever.core import RetrieverCore
        from services.retriever.servicer import serve

        core = await asyncio.to_thread(RetrieverCore, settings.retriever)
        server, bound = await serve(core, port=RETRIEVER_GRPC_PORT if port is None else port)
        bus.subscribe(RETRIEVER_GROUP, core.sessions)
        stoppers = [lambda: stop_server(server, settings.generator.grace_s), lambda: asyncio.to_thread(core.close)]
    elif name == "draftcache":
        from services.draftcache.servicer import serve

        service = await serve(settings.draftcache, port=DRAFTCACHE_GRPC_PORT if port is None else port)
        bound = service.port
        bus.subscribe(DRAFTCACHE_GROUP, service.store)
        stoppers = [lambda: service.stop(settings.generator.grace_s)]
    else:
        from lookahead_core import load_model
        from lookahead_rag.v1 import generator_pb2_grpc

        from services.common.grpcutil import start_server
        from services.generator.clients import GrpcDraftClient, GrpcRetrieverClient
        from services.generator.engine import GeneratorEngine
        from services.generator.servicer import SERVICE_NAME, GeneratorServicer

        gs = settings.generator
        model, tok = await asyncio.to_thread(load_model, gs.model)
        rch = open_channel(gs.retriever_target or f"127.0.0.1:{RETRIEVER_GRPC_PORT}", gs.max_message_bytes)
        dch = open_channel(gs.draftcache_target or f"127.0.0.1:{DRAFTCACHE_GRPC_PORT}", gs.max_message_bytes)
        engine = GeneratorEngine(gs, model, tok, GrpcRetrieverClient(rch), GrpcDraftClient(dch), bus)
        server, bound = await start_server(
            [(generator_pb2_grpc.add_GeneratorServicer_to_server, GeneratorServicer(engine))], [SERVICE_NAME],
            port=gs.port if port is None else port, host=gs.host, max_message_bytes=gs.max_message_bytes)
        stoppers = [lambda: stop_server(server, gs.grace_s), rch.close, dch.close]
    await bus.start()
    print(f"{name} serving on 127.0.0.1:{bound} (Ctrl-C to stop)", flush=True)
    await _wait_for_signal()
    for stop in stoppers:
        await stop()
    await bus.stop()


async def _serve_all(settings: AllSettings) -> None:
    pipeline = await Pipeline.start(
        settings, grpc_servers=True, bind={"retriever": RETRIEVER_GRPC_PORT, "draftcache": DRAFTCACHE_GRPC_PORT})
    ports = ", ".join(f"{k} 127.0.0.1:{v}" for k, v in pipeline.ports.items())
    print(f"serving {ports} (Ctrl-C to stop)", flush=True)
    await _wait_for_signal()
    await pipeline.stop()


def main(argv: list[str] | None = None) -> int:
    from services.common.logging import setup_logging

    args = parse_args(argv or [])
    setup_logging("INFO", json=not args.text_logs)
    overrides: dict[str, dict[str, Any]] = {}
    if args.kafka:
        overrides["kafka"] = {"bootstrap_servers": args.kafka}
    settings = AllSettings.load(args.config, **overrides)
    if args.service == "all":
        asyncio.run(_serve_all(settings))
    else:
        asyncio.run(_serve_one(args.service, settings, args.port))
    return 0
