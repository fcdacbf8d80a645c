"""``build_generator``: the generator as one Service (GeneratorCore, servicer, metrics).

    service = await build_generator(settings, limits, bus, registry, retriever_client, draft_cache_client,
                                    served=ModelSettings())
    await service.serve(port=0)          # or call service.core (the GeneratorCore) in-process

The model loads here unless the caller already holds one (``model``/``tokenizer``); the generator
publishes finished answers on ``bus`` and reaches the other two services through the clients.
``forgets`` (``lookahead_rag.services.generator.forget.subscribe_forgets``, subscribed before the bus started)
drops a tenant's prefix KV in this engine when a ``ForgetRequested`` comes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lookahead_core import tokenizer_id
from lookahead_core.serving import load_model
from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.errors import FailedPrecondition
from lookahead_rag.services.common.model_settings import ModelSettings
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.service import Service
from lookahead_rag.services.common.settings import ConfigError
from lookahead_rag.services.events.protocols import EventPublisher
from lookahead_rag.services.generator.clients import DraftCacheClient, RetrieverClient
from lookahead_rag.services.generator.core import GeneratorCore
from lookahead_rag.services.generator.forget import PrefixForgets
from lookahead_rag.services.generator.metrics import GeneratorMetrics
from lookahead_rag.services.generator.servicer import SERVICE_NAME, GeneratorServicer
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.v1 import generator_pb2_grpc

log = logging.getLogger(__name__)


async def check_same_model(retriever: RetrieverClient, model: str, tokenizer: str, timeout_s: float) -> None:
    """Refuse to start beside a retriever that builds prompts for another model (FailedPrecondition).

    A retriever that cannot be reached now is not an error: the generator answers without documents
    until it is up, and every Retrieve call carries the tokenizer id, so a mismatch is refused then.
    """
    try:
        their_model, their_tokenizer = await retriever.served_model(timeout_s)
    except Exception as exc:  # unreachable or late: checked again on every call
        log.warning("retriever not reachable at start-up (%s); its model is checked on every call",
                    type(exc).__name__)
        return
    if their_tokenizer and their_tokenizer != tokenizer:
        raise FailedPrecondition(
            f"the retriever serves model {their_model!r} (tokenizer {their_tokenizer}) but the generator serves "
            f"{model!r} (tokenizer {tokenizer}): set the same [model] name for both services"
        )


async def load_draft_model(name: str, served: ModelSettings, tokenizer: Any) -> Any:
    """``[generator] draft_model``, loaded like the served model; its tokenizer must be the served one's."""
    draft, draft_tokenizer = await asyncio.to_thread(load_model, name, served.dtype, served.device)
    if tokenizer_id(draft_tokenizer) != tokenizer_id(tokenizer):
        raise ConfigError(f"draft_model {name!r} has another tokenizer than the served model {served.name!r}")
    return draft


async def build_generator(settings: GeneratorSettings, limits: RequestLimits, bus: EventPublisher,
                          registry: CollectorRegistry, retriever: RetrieverClient | None,
                          draft_cache: DraftCacheClient | None, *, served: ModelSettings, model: Any = None,
                          tokenizer: Any = None, forgets: PrefixForgets | None = None) -> Service[GeneratorCore]:
    """Load the served model (unless given) and start the engine's step scheduler."""
    if model is None or tokenizer is None:
        model, tokenizer = await asyncio.to_thread(load_model, served.name, served.dtype, served.device,
                                                 weights=served.weights, activations=served.activations)
    if retriever is not None:
        await check_same_model(retriever, served.name, tokenizer_id(tokenizer), settings.retrieve_timeout_s)
    draft = await load_draft_model(settings.draft_model, served, tokenizer) if settings.draft_model else None
    generator = GeneratorCore(settings, model, tokenizer, retriever, draft_cache, bus,
                             metrics=GeneratorMetrics.of(registry), limits=limits, model_name=served.name,
                             draft_model=draft)
    if forgets is not None:
        forgets.attach(generator.scheduler.forgets_to())

    async def close() -> None:
        generator.close()

    return Service(
        "generator", generator, settings,
        handlers=[(generator_pb2_grpc.add_GeneratorServicer_to_server, GeneratorServicer(generator))],
        service_names=[SERVICE_NAME],
        max_message_bytes=settings.max_message_bytes,
        jobs=[generator.observe_metrics],
        closers=[close],
    )
