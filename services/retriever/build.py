"""``build_retriever``: the retriever as one Service (its core, servicer, bus subscriptions, metrics).

    service = await build_retriever(settings, limits, bus, registry)   # loads indexes and the embedder
    service = wire_retriever(core, bus, registry)                      # ... or wires a loaded core
    LocalRetrieverClient(service.core)  or  await service.serve(port=0)

Every replica holds all of the state: it follows the finished answers and forgets (past sessions) and the
document changes (tenant indexes) in full (``every_replica``: all partitions, its own group id), and
its Ingest and Delete publish document changes for the others (``doc_writer``). A new replica
catches up from the beginning of the documents topic; a restarted one from its snapshot + offsets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.model_settings import ModelSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.service import Service
from lookahead_rag.services.events.metrics import ConsumerMetrics, ObservedApplier, consumer_jobs
from lookahead_rag.services.events.protocols import RETRIEVER_DOCUMENTS_GROUP, RETRIEVER_GROUP, EventBus, EventPublisher
from lookahead_rag.services.events.streams import DOCUMENTS
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.doc_applier import DocumentsApplier
from lookahead_rag.services.retriever.doc_writer import DocumentWriter
from lookahead_rag.services.retriever.forget import ForgetWriter
from lookahead_rag.services.retriever.servicer import SERVICE_NAME, RetrieverServicer
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.v1 import retriever_pb2_grpc

log = logging.getLogger(__name__)


async def build_retriever(settings: RetrieverSettings, limits: RequestLimits, bus: EventBus,
                          registry: CollectorRegistry, tokenizer: Any = None,
                          served: ModelSettings | None = None) -> Service[RetrieverCore]:
    """Load the tenant indexes and past sessions, then ``wire_retriever`` them to the bus.

    ``served`` names the model whose tokenizer and chat template build prompts; ``tokenizer`` (that
    model's) saves loading it again when the generator shares the process.
    """
    core = await asyncio.to_thread(RetrieverCore, settings, tokenizer=tokenizer, limits=limits, served=served)
    return wire_retriever(core, bus, registry)


def wire_retriever(core: RetrieverCore, bus: EventBus, registry: CollectorRegistry) -> Service[RetrieverCore]:
    """A loaded core as a Service on ``bus``: past sessions follow the finished answers, the tenant
    indexes the document changes (both in full on every replica); Ingest and Delete publish changes."""
    consumers = ConsumerMetrics.of(registry)
    sessions = ObservedApplier(core.sessions, RETRIEVER_GROUP, consumers)
    bus.subscribe(RETRIEVER_GROUP, sessions, every_replica=True)
    documents = ObservedApplier(DocumentsApplier(core.documents), RETRIEVER_DOCUMENTS_GROUP, consumers)
    bus.subscribe(RETRIEVER_DOCUMENTS_GROUP, documents, stream=DOCUMENTS, every_replica=True)
    service = retriever_service(core, bus)
    service.jobs += consumer_jobs(bus, [RETRIEVER_GROUP, RETRIEVER_DOCUMENTS_GROUP], consumers)
    service.loops.append(lambda: save_indexes_every(core, core.settings.index_save_interval_s))
    return service


async def save_indexes_every(core: RetrieverCore, interval_s: float) -> None:
    """Write the tenant indexes that replicated changes touched, every ``interval_s`` (until cancelled)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(core.documents.save_changed)
        except Exception:  # a full disk must not stop the service; the next interval retries
            log.exception("writing the changed tenant indexes failed")


def retriever_service(core: RetrieverCore, publisher: EventPublisher | None = None) -> Service[RetrieverCore]:
    """A loaded core as a Service (its servicer; closing it closes the core), subscribed to nothing.

    ``publisher``: where Ingest and Delete announce their document changes and Forget its event (None:
    this replica only).
    """
    servicer = RetrieverServicer(core, DocumentWriter(core, publisher), ForgetWriter(core, publisher))
    return Service(
        "retriever", core, core.settings,
        handlers=[(retriever_pb2_grpc.add_RetrieverServicer_to_server, servicer)],
        service_names=[SERVICE_NAME], max_message_bytes=core.settings.max_message_bytes,
        closers=[lambda: asyncio.to_thread(core.close)],
    )
