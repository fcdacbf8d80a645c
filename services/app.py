"""Assembling the services: each alone (``serve X``) or all three in one process (demo, ``serve all``).

In one process the generator calls the retriever and draft cache either directly (``grpc=False``,
the embedded default) or through their gRPC servers (``grpc=True``, each bound to its settings'
host and port unless ``bind`` says otherwise); the event bus is in-process unless Kafka is
configured. Either way the same library objects do the work.

Metrics: one CollectorRegistry per pipeline (``pipeline.registry``; two pipelines in one process
never collide): gRPC calls of all three servers, the generator's decoding, the draft cache's fetch
latency and trie sizes, both consumers' counters and lag, and the outbox depth with Kafka.
``metrics_port`` serves it at ``/metrics``; ``refresh_metrics()`` samples the state gauges now
(a background task does it every ``metrics_refresh_s``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from lookahead_rag.v1 import generator_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.bus import EventBus
from services.common.grpcutil import local_target, open_channel, start_server, stop_server
from services.common.kafka_settings import DRAFTCACHE_GROUP, RETRIEVER_GROUP, KafkaSettings, make_bus
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
    start_metrics_server,
    stop_metrics_server,
)
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
    """All three services in one process; ``ports`` holds the bound gRPC ports when servers run."""

    settings: AllSettings
    engine: GeneratorEngine
    retriever: Any  # RetrieverCore
    draftcache: Any  # DraftCacheStore
    bus: EventBus
    registry: CollectorRegistry
    refresher: Refresher
    servers: list[grpc.aio.Server] = field(default_factory=list)  # retriever, then generator
    server_graces: list[float] = field(default_factory=list)  # each server's shutdown_grace_s
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    draftcache_service: Any = None
    ports: dict[str, int] = field(default_factory=dict)
    metrics_port: int | None = None  # the bound /metrics port, when one was asked for

    @classmethod
    async def start(cls, settings: AllSettings, grpc_servers: bool = False, model: Any = None,
                    tokenizer: Any = None, bind: dict[str, int] | None = None,
                    registry: CollectorRegistry | None = None, metrics_port: int | None = None) -> Pipeline:
        """Load everything, wire the bus and the metrics, and (with ``grpc_servers``) start the servers.

        Each server binds its settings' host and port; ``bind`` overrides ports by service name
        (0: any free port). ``registry`` defaults to a new one; ``metrics_port`` (0: any free port)
        serves it on the generator's host.
        """
        from lookahead_core import load_model

        from services.draftcache.servicer import build as build_draftcache
        from services.draftcache.servicer import serve as serve_draftcache
        from services.retriever.core import RetrieverCore
        from services.retriever.servicer import serve as serve_retriever

        gs, rs, ds = settings.generator, settings.retriever, settings.draftcache
        bind = bind or {}
        registry = CollectorRegistry() if registry is None else registry
        consumers = ConsumerMetrics.of(registry)
        if model is None or tokenizer is None:
            model, tokenizer = await asyncio.to_thread(load_model, gs.model)
        core = await asyncio.to_thread(RetrieverCore, rs, tokenizer=tokenizer)
        bus = make_bus(settings.kafka, Path(gs.data_dir))
        servers: list[grpc.aio.Server] = []
        graces: list[float] = []
        channels: list[grpc.aio.Channel] = []
        ports: dict[str, int] = {}
        service = None
        interceptors = [ObservabilityInterceptor(registry)]
        if grpc_servers:
            rserver, ports["retriever"] = await serve_retriever(
                core, port=bind.get("retriever", rs.port), host=rs.host, interceptors=interceptors)
            servers.append(rserver)
            graces.append(rs.shutdown_grace_s)
            service = await serve_draftcache(ds, port=bind.get("draftcache", ds.port), host=ds.host,
                                             interceptors=interceptors, metrics=DraftCacheMetrics.of(registry))
            ports["draftcache"] = service.port
            store, meter = service.store, service.meter
            rch = open_channel(local_target(rs.host, ports["retriever"]), gs.max_message_bytes)
            dch = open_channel(local_target(ds.host, ports["draftcache"]), gs.max_message_bytes)
            channels += [rch, dch]
            rclient: Any = GrpcRetrieverClient(rch)
            dclient: Any = GrpcDraftClient(dch)
        else:
            store, servicer = await asyncio.to_thread(build_draftcache, ds, DraftCacheMetrics.of(registry))
            meter = servicer.meter
            rclient, dclient = LocalRetrieverClient(core), LocalDraftClient(meter)
        bus.subscribe(DRAFTCACHE_GROUP, meter.applier(consumers))
        bus.subscribe(RETRIEVER_GROUP, ObservedApplier(core.sessions, RETRIEVER_GROUP, consumers))
        jobs = [meter.refresh_sizes, *consumer_jobs(bus, [DRAFTCACHE_GROUP, RETRIEVER_GROUP], consumers)]
        refresher = Refresher(min(gs.metrics_refresh_s, rs.metrics_refresh_s, ds.metrics_refresh_s), jobs)
        if settings.kafka.enabled:
            refresher.add(outbox_job(bus, OutboxMetrics.of(registry)))
        await bus.start()
        engine = GeneratorEngine(gs, model, tokenizer, rclient, dclient, bus, metrics=GeneratorMetrics.of(registry))
        refresher.add(engine.observe_metrics)
        pipeline = cls(settings, engine, core, store, bus, registry, refresher, servers, graces, channels, service,
                       ports)
        if grpc_servers:
            gserver, ports["generator"] = await start_server(
                [(generator_pb2_grpc.add_GeneratorServicer_to_server, GeneratorServicer(engine))],
                [GENERATOR_SERVICE], port=bind.get("generator", gs.port), host=gs.host,
                max_message_bytes=gs.max_message_bytes, interceptors=interceptors,
            )
            servers.append(gserver)
            graces.append(gs.shutdown_grace_s)
        await refresher.start()
        if metrics_port is not None:
            pipeline.metrics_port = start_metrics_server(metrics_port, registry, gs.host)
        return pipeline

    def refresh_metrics(self) -> None:
        """Sample the state gauges now (consumer counters and lag, outbox depth, changed trie sizes)."""
        self.refresher.refresh_now()

    async def stop(self) -> None:
        """Graceful: servers finish in-flight calls within their grace period, then state is saved."""
        await self.refresher.stop()
        if self.metrics_port is not None:
            stop_metrics_server(self.metrics_port)
            self.metrics_port = None
        for server, grace in reversed(list(zip(self.servers, self.server_graces, strict=True))):
            await stop_server(server, grace)
        if self.draftcache_service is not None:
            await self.draftcache_service.stop(self.settings.draftcache.shutdown_grace_s)  # ends with a snapshot
        else:
            from services.draftcache.servicer import save_if_changed

            await save_if_changed(self.draftcache)
        for channel in self.channels:
            await channel.close()
        await self.bus.stop()
        self.engine.close()
        await asyncio.to_thread(self.retriever.close)
