"""Assembling the services, in one place: the embedded pipeline, ``serve <service>`` and ``serve all``.

Each service is built by its own ``build_<service>(settings, limits, bus, registry)``; this module
only decides which services run here, how the generator reaches the other two, and which ports
open::

    pipeline = await Pipeline.start(settings)                          # all three, in-process calls
    pipeline = await Pipeline.start(settings, grpc_servers=True)       # all three, each on its port
    pipeline = await Pipeline.start(settings, ("retriever",), grpc_servers=True)   # serve retriever

The generator calls a retriever or draft cache built here directly (``grpc_servers=False``) or
through its gRPC server (``grpc_servers=True``); one that is not built here it reaches at its
settings' target. The event bus is in-process unless Kafka is configured.

Metrics: one CollectorRegistry per pipeline (``pipeline.registry``; two pipelines in one process
never collide): gRPC calls of every server, each service's own groups, the consumers' counters
and lag, and the outbox with Kafka. ``metrics_port`` serves it at ``/metrics``;
``refresh_metrics()`` samples the state gauges now (a background task does it every
``metrics_refresh_s``). The HTTP endpoint serves the same registry at its own ``/metrics``.

Tracing: with an OTLP endpoint (``[tracing]``, services.common.telemetry.tracing) every server, channel and
the HTTP endpoint started here carry one trace per request; off, nothing is installed.

Heap: once started, everything alive is frozen out of Python's cyclic collector
(``lookahead_rag.services.common.heap``): a full collection then walks only what requests built since, not
the ~600k objects of the model, tokenizer and caches; ``stop()`` thaws it.

HTTP: with ``grpc_servers`` and the generator built here, the OpenAI-compatible endpoint
(``lookahead_rag.services.http``, ``[http]`` settings) serves the same generator on ``http_port`` (``bind["http"]``
overrides its port); ``stop()`` closes it first, gracefully. Its ``POST /v1/documents`` is the retriever's
Ingest RPC (``ingest_over_grpc``), at this process's retriever server or ``[generator] retriever_target``.

Auth: with ``[auth] mode = "required"`` every gRPC server here refuses a call whose credential is not
for its tenant (``lookahead_rag.services.common.auth.interceptor``), so does the HTTP endpoint, and the generator's
clients send ``[auth] service_key`` (a key for every tenant) to the other two.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.auth.callers import Authenticator
from lookahead_rag.services.common.auth.interceptor import server_interceptors
from lookahead_rag.services.common.auth.tls import TlsSettings, check_bind, server_credentials
from lookahead_rag.services.common.errors import error_of_status
from lookahead_rag.services.common.heap import freeze_startup_heap, thaw_heap
from lookahead_rag.services.common.ports import (  # start order: retriever, draftcache, generator
    DRAFTCACHE_GRPC_PORT,
    RETRIEVER_GRPC_PORT,
    SERVICES,
)
from lookahead_rag.services.common.rpc.grpcutil import local_target, open_channel
from lookahead_rag.services.common.rpc.tenant_route import TenantRouteInterceptor
from lookahead_rag.services.common.service import Service
from lookahead_rag.services.common.telemetry import tracing
from lookahead_rag.services.common.telemetry.observability import start_metrics_server, stop_metrics_server
from lookahead_rag.services.common.telemetry.refresher import Refresher
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.draftcache.build import DraftCacheService, build_draftcache
from lookahead_rag.services.draftcache.client import GrpcDraftCacheClient, LocalDraftCacheClient
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.factory import make_bus
from lookahead_rag.services.events.metrics import OutboxMetrics, outbox_job
from lookahead_rag.services.events.protocols import EventBus
from lookahead_rag.services.generator.build import build_generator
from lookahead_rag.services.generator.clients import DraftCacheClient, RetrieverClient
from lookahead_rag.services.generator.core import GeneratorCore
from lookahead_rag.services.generator.forget import subscribe_forgets
from lookahead_rag.services.http.ingest import DocumentIn, Ingest, IngestCounts
from lookahead_rag.services.http.server import HttpServer
from lookahead_rag.services.retriever.build import build_retriever
from lookahead_rag.services.retriever.client import GrpcRetrieverClient, LocalRetrieverClient
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.ingest_cli import DEFAULT_BATCH_DOCS, DEFAULT_TIMEOUT_S, send

log = logging.getLogger(__name__)



@dataclass
class Pipeline:
    """The services of one process; ``ports`` holds the bound gRPC ports when servers run."""

    settings: AllSettings
    bus: EventBus
    registry: CollectorRegistry
    refresher: Refresher
    services: dict[str, Service[Any]]  # built here, by name, in start order
    channels: list[grpc.aio.Channel] = field(default_factory=list)  # the generator's, to the other two
    ports: dict[str, int] = field(default_factory=dict)
    metrics_port: int | None = None  # the bound /metrics port, when one was asked for
    http: HttpServer | None = None  # the OpenAI-compatible endpoint, when it runs here
    http_port: int | None = None  # its bound port
    server_credentials: grpc.ServerCredentials | None = None  # TLS of the gRPC servers ([tls]); None: plaintext

    @property
    def generator(self) -> GeneratorCore:
        return self.services["generator"].core

    @property
    def retriever(self) -> RetrieverCore:
        return self.services["retriever"].core

    @property
    def draftcache(self) -> DraftCacheStore:
        return self.services["draftcache"].core

    @classmethod
    async def start(cls, settings: AllSettings, names: Sequence[str] = SERVICES, *, grpc_servers: bool = False,
                    model: Any = None, tokenizer: Any = None, bind: dict[str, int] | None = None,
                    registry: CollectorRegistry | None = None, metrics_port: int | None = None) -> Pipeline:
        """Build ``names`` (a subset of SERVICES), wire the bus and the metrics, and (with
        ``grpc_servers``) serve each on its settings' host and port.

        ``bind`` overrides ports by service name (0: any free port). ``model``/``tokenizer`` skip
        loading the model again. ``registry`` defaults to a new one; ``metrics_port`` (0: any free
        port) serves it on the first service's host.
        """
        unknown = set(names) - set(SERVICES)
        if unknown or not names:
            raise ValueError(f"services must be some of {', '.join(SERVICES)}; got {', '.join(names) or 'none'}")
        bind = bind or {}
        credentials = None
        if grpc_servers:  # before anything starts: refuse plaintext or no auth beyond loopback; read the certificates
            check_bind(listen_hosts(settings, names), settings.tls, settings.auth)
            credentials = server_credentials(settings.tls)
        registry = CollectorRegistry() if registry is None else registry
        tracing.setup(settings.tracing, names)  # [tracing]: once per process, before any server or channel
        auth = Authenticator(settings.auth)  # one keys file view for every server here ([auth])
        checks = server_interceptors(registry, auth)  # observability, then auth (tenant bound after it)
        # then: x-tenant metadata at most once and, if sent, the request's tenant; the generator's, behind a
        # tenant-routing proxy, must be sent ([generator] tenant_routing)
        interceptors = [*checks, TenantRouteInterceptor()]
        routed = [*checks, TenantRouteInterceptor(required=settings.generator.tenant_routing)]
        bus = make_bus(settings.kafka, _bus_dir(settings, names), tracing.tracer(tracing.EVENTS_TRACER))
        pipeline = cls(settings, bus, registry, Refresher(_refresh_s(settings, names)), {})
        pipeline.server_credentials = credentials
        if "generator" in names:  # first: only the engine's thread may hold an OpenMP pool (lookahead_core.threads)
            from lookahead_core.threads import serve_single_threaded  # torch: only where the generator runs

            serve_single_threaded()
        if "generator" in names and (model is None or tokenizer is None):
            from lookahead_core.models import load_model

            served = settings.model
            model, tokenizer = await asyncio.to_thread(load_model, served.name, served.dtype, served.device,
                                                 weights=served.weights, activations=served.activations)
        if "retriever" in names:
            await pipeline._add(await build_retriever(settings.retriever, settings.limits, bus, registry, tokenizer,
                                                      served=settings.model),
                                grpc_servers, bind, interceptors)
        if "draftcache" in names:
            await pipeline._add(await build_draftcache(settings.draftcache, settings.limits, bus, registry),
                                grpc_servers, bind, interceptors)
        forgets = None
        if "generator" in names:  # subscribed before the bus starts (Kafka); every replica applies forgets
            forgets, forget_jobs = subscribe_forgets(bus, registry)
            for job in forget_jobs:
                pipeline.refresher.add(job)
        await bus.start()
        if settings.kafka.enabled:  # every outbox here: the generator's answers, the retriever's documents
            pipeline.refresher.add(outbox_job(bus, OutboxMetrics.of(registry)))
        if "generator" in names:
            retriever, draft_cache = pipeline._clients(grpc_servers)
            generator = await build_generator(settings.generator, settings.limits, bus, registry, retriever,
                                              draft_cache, served=settings.model, model=model, tokenizer=tokenizer,
                                              forgets=forgets)
            await pipeline._add(generator, grpc_servers, bind, routed)
            if grpc_servers and settings.http.enabled:
                documents = ingest_over_grpc(pipeline._retriever_target(), settings.tls)
                pipeline.http = await HttpServer.start(pipeline.generator, settings.http, bind.get("http"),
                                                       settings.tls, auth, registry, documents)
                pipeline.http_port = pipeline.http.port
        await pipeline.refresher.start()
        if metrics_port is not None:
            first = pipeline.services[names[0]].settings
            pipeline.metrics_port = start_metrics_server(metrics_port, registry, first.host)
        freeze_startup_heap()  # last: what start-up built is never walked by a collection again
        return pipeline

    async def _add(self, service: Service[Any], grpc_servers: bool, bind: dict[str, int],
                   interceptors: list[grpc.aio.ServerInterceptor]) -> None:
        self.services[service.name] = service
        for job in service.jobs:
            self.refresher.add(job)
        await service.start()
        if grpc_servers:
            self.ports[service.name] = await service.serve(bind.get(service.name), interceptors=interceptors,
                                                           credentials=self.server_credentials)

    def _clients(self, grpc_servers: bool) -> tuple[RetrieverClient, DraftCacheClient]:
        """The generator's way to each of the other two: in-process, this process's server, or a target."""
        gs = self.settings.generator
        retriever: RetrieverClient
        draft_cache: DraftCacheClient
        if "retriever" in self.services and not grpc_servers:
            retriever = LocalRetrieverClient(self.retriever)
        else:
            retriever = GrpcRetrieverClient(self._channel("retriever", gs.retriever_target, RETRIEVER_GRPC_PORT),
                                            self.settings.auth.service_key)
        if "draftcache" in self.services and not grpc_servers:
            service = self.services["draftcache"]
            assert isinstance(service, DraftCacheService)
            draft_cache = LocalDraftCacheClient(service.meter)
        else:
            draft_cache = GrpcDraftCacheClient(self._channel("draftcache", gs.draftcache_target, DRAFTCACHE_GRPC_PORT),
                                               self.settings.auth.service_key)
        return retriever, draft_cache

    def _target(self, name: str, target: str, default_port: int) -> str:
        """Where this process reaches service ``name``: its own server, else ``target``, else loopback."""
        if name in self.ports:  # served by this process
            return local_target(self.services[name].settings.host, self.ports[name])
        return target or f"127.0.0.1:{default_port}"

    def _retriever_target(self) -> str:
        return self._target("retriever", self.settings.generator.retriever_target, RETRIEVER_GRPC_PORT)

    def _channel(self, name: str, target: str, default_port: int) -> grpc.aio.Channel:
        channel = open_channel(self._target(name, target, default_port), self.settings.generator.max_message_bytes,
                               self.settings.tls, self.settings.channels)
        self.channels.append(channel)
        return channel

    def refresh_metrics(self) -> None:
        """Sample the state gauges now (consumer counters and lag, outbox depth, changed trie sizes)."""
        self.refresher.refresh_now()

    async def stop(self) -> None:
        """Graceful: servers finish in-flight calls within their grace, the bus drains, then state is saved."""
        await self.refresher.stop()
        if self.metrics_port is not None:
            stop_metrics_server(self.metrics_port)
            self.metrics_port = None
        if self.http is not None:  # first: its requests run on the engine the generator's close frees
            await self.http.stop()
            self.http = None
        services = list(reversed(self.services.values()))
        for service in services:
            await service.stop_serving()
        for channel in self.channels:
            await channel.close()
        await self.bus.stop()
        for service in services:
            await service.close()
        thaw_heap()  # the stopped services' cycles can be collected again


def ingest_over_grpc(target: str, tls: TlsSettings) -> Ingest:
    """``POST /v1/documents`` as the retriever's Ingest at ``target`` (``lookahead-rag ingest``'s batches),
    sent with the HTTP caller's own key; a refusal raises the ServiceError the retriever raised."""

    async def ingest(tenant: str, documents: Sequence[DocumentIn], key: str | None) -> IngestCounts:
        docs = [Document(d.id, d.title, d.text, d.source) for d in documents]
        try:
            counts = await send(target, tenant, docs, DEFAULT_BATCH_DOCS, DEFAULT_TIMEOUT_S, progress=False,
                                tls=tls, key=key)
        except grpc.aio.AioRpcError as err:
            raise error_of_status(err.code(), err.details()) from err
        return IngestCounts(*counts)

    return ingest


def listen_hosts(settings: AllSettings, names: Sequence[str]) -> dict[str, str]:
    """server -> the address it binds when ``names`` are served here: each service's gRPC (and
    metrics) host, and the HTTP endpoint's beside the generator."""
    hosts = {name: getattr(settings, name).host for name in names}
    if "generator" in names and settings.http.enabled:
        hosts["http"] = settings.http.host
    return hosts


def _bus_dir(settings: AllSettings, names: Sequence[str]) -> Path:
    """Where the Kafka state lives (consumer snapshots, the outbox): the generator's data_dir when it
    runs here, else the first service's, or a fresh temp dir when it keeps nothing."""
    own = "generator" if "generator" in names else names[0]
    data_dir = getattr(settings, own).data_dir
    if data_dir is not None:
        return Path(data_dir)
    return Path(tempfile.mkdtemp(prefix=f"lookahead-rag-{own}-bus-"))


def _refresh_s(settings: AllSettings, names: Sequence[str]) -> float:
    return min(getattr(settings, name).metrics_refresh_s for name in names)
