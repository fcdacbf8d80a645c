"""Assembling the services: each alone (``serve X``) or all three in one process (demo, ``serve all``).

In one process the generator calls the retriever and draft cache either directly (``grpc=False``,
the embedded default) or through their gRPC servers on loopback (``grpc=True``); the event bus is
in-process unless Kafka is configured. Either way the same library objects do the work.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from lookahead_rag.v1 import generator_pb2_grpc

from services.common.bus import EventBus
from services.common.grpcutil import open_channel, start_server, stop_server
from services.common.kafka_settings import DRAFTCACHE_GROUP, RETRIEVER_GROUP, KafkaSettings, make_bus
from services.common.settings import load_settings
from services.draftcache.settings import DraftCacheSettings
from services.generator.clients import GrpcDraftClient, GrpcRetrieverClient, LocalDraftClient, LocalRetrieverClient
from services.generator.engine import GeneratorEngine
from services.generator.servicer import SERVICE_NAME as GENERATOR_SERVICE
from services.generator.servicer import GeneratorServicer
from services.generator.settings import GeneratorSettings
from services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)


@dataclass
class AllSettings:
    """The four sections of the configuration."""

    generator: GeneratorSettings
    retriever: RetrieverSettings
    draftcache: DraftCacheSettings
    kafka: KafkaSettings

    @classmethod
    def load(cls, config_file: str | None = None, **sections: dict[str, Any]) -> AllSettings:
        """Defaults < TOML file < environment < ``sections`` overrides (e.g. generator={"port": 0})."""
        return cls(
            generator=load_settings(GeneratorSettings, "generator", config_file, **sections.get("generator", {})),
            retriever=load_settings(RetrieverSettings, "retriever", config_file, **sections.get("retriever", {})),
            draftcache=load_settings(DraftCacheSettings, "draftcache", config_file,
                                     **sections.get("draftcache", {})),
            kafka=load_settings(KafkaSettings, "kafka", config_file, **sections.get("kafka", {})),
        )


@dataclass
class Pipeline:
    """All three services in one process; ``generator_port`` is set when gRPC servers run."""

    settings: AllSettings
    engine: GeneratorEngine
    retriever: Any  # RetrieverCore
    draftcache: Any  # DraftCacheStore
    bus: EventBus
    servers: list[grpc.aio.Server] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    draftcache_service: Any = None
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    async def start(cls, settings: AllSettings, grpc_servers: bool = False, model: Any = None,
                    tokenizer: Any = None, bind: dict[str, int] | None = None) -> Pipeline:
        """Load everything, wire the bus, and (with ``grpc_servers``) start the three servers.

        ``bind`` gives the retriever's and draft cache's ports (default 0: any free port); the
        generator binds ``settings.generator.port``.
        """
        from lookahead_core import load_model

        from services.draftcache.servicer import build as build_draftcache
        from services.draftcache.servicer import serve as serve_draftcache
        from services.retriever.core import RetrieverCore
        from services.retriever.servicer import serve as serve_retriever

        gs = settings.generator
        if model is None or tokenizer is None:
            model, tokenizer = await asyncio.to_thread(load_model, gs.model)
        core = await asyncio.to_thread(RetrieverCore, settings.retriever, tokenizer=tokenizer)
        bus = make_bus(settings.kafka, Path(gs.data_dir))
        servers: list[grpc.aio.Server] = []
        channels: list[grpc.aio.Channel] = []
        ports: dict[str, int] = {}
        service = None
        if grpc_servers:
            bind = bind or {}
            rserver, ports["retriever"] = await serve_retriever(core, port=bind.get("retriever", 0))
            service = await serve_draftcache(settings.draftcache, port=bind.get("draftcache", 0))
            ports["draftcache"] = service.port
            store = service.store
            servers.append(rserver)
            rch = open_channel(f"127.0.0.1:{ports['retriever']}", gs.max_message_bytes)
            dch = open_channel(f"127.0.0.1:{ports['draftcache']}", gs.max_message_bytes)
            channels += [rch, dch]
            rclient: Any = GrpcRetrieverClient(rch)
            dclient: Any = GrpcDraftClient(dch)
        else:
            store, _ = await asyncio.to_thread(build_draftcache, settings.draftcache)
            rclient, dclient = LocalRetrieverClient(core), LocalDraftClient(store)
        bus.subscribe(DRAFTCACHE_GROUP, store)
        bus.subscribe(RETRIEVER_GROUP, core.sessions)
        await bus.start()
        engine = GeneratorEngine(gs, model, tokenizer, rclient, dclient, bus)
        pipeline = cls(settings, engine, core, store, bus, servers, channels, service, ports)
        if grpc_servers:
            gserver, ports["generator"] = await start_server(
                [(generator_pb2_grpc.add_GeneratorServicer_to_server, GeneratorServicer(engine))],
                [GENERATOR_SERVICE], port=gs.port, host=gs.host, max_message_bytes=gs.max_message_bytes,
            )
            servers.append(gserver)
        return pipeline

    async def stop(self) -> None:
        """Graceful: servers finish in-flight calls within the grace period, then state is saved."""
        grace = self.settings.generator.grace_s
        for server in reversed(self.servers):
            await stop_server(server, grace)
        if self.draftcache_service is not None:
            await self.draftcache_service.stop(grace)  # ends with a final snapshot
        else:
            from services.draftcache.servicer import save_if_changed

            await save_if_changed(self.draftcache)
        for channel in self.channels:
            await channel.close()
        await self.bus.stop()
        self.engine.close()
        await asyncio.to_thread(self.retriever.close)
