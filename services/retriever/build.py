"""``build_retriever``: the retriever as one Service (its core, servicer, bus subscription, metrics).

    service = await build_retriever(settings, limits, bus, registry)   # loads indexes and the embedder
    LocalRetrieverClient(service.core)  or  await service.serve(port=0)
"""

from __future__ import annotations

import asyncio
from typing import Any

from lookahead_rag.v1 import retriever_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.limits import RequestLimits
from services.common.model_settings import ModelSettings
from services.common.service import Service
from services.events.metrics import ConsumerMetrics, ObservedApplier, consumer_jobs
from services.events.protocols import RETRIEVER_GROUP, EventBus
from services.retriever.core import RetrieverCore
from services.retriever.servicer import SERVICE_NAME, RetrieverServicer
from services.retriever.settings import RetrieverSettings


async def build_retriever(settings: RetrieverSettings, limits: RequestLimits, bus: EventBus,
                          registry: CollectorRegistry, tokenizer: Any = None,
                          served: ModelSettings | None = None) -> Service[RetrieverCore]:
    """Load the tenant indexes and past sessions; past sessions follow the bus's finished answers.

    ``served`` names the model whose tokenizer and chat template build prompts; ``tokenizer`` (that
    model's) saves loading it again when the generator shares the process.
    """
    core = await asyncio.to_thread(RetrieverCore, settings, tokenizer=tokenizer, limits=limits, served=served)
    consumers = ConsumerMetrics.of(registry)
    bus.subscribe(RETRIEVER_GROUP, ObservedApplier(core.sessions, RETRIEVER_GROUP, consumers))
    service = retriever_service(core)
    service.jobs += consumer_jobs(bus, [RETRIEVER_GROUP], consumers)
    return service


def retriever_service(core: RetrieverCore) -> Service[RetrieverCore]:
    """A loaded core as a Service (its servicer; closing it closes the core), subscribed to nothing."""
    return Service(
        "retriever", core, core.settings,
        handlers=[(retriever_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(core))],
        service_names=[SERVICE_NAME],
        closers=[lambda: asyncio.to_thread(core.close)],
    )
