"""bench hostile's stack: the three services in this process with keys required and the OpenAI door on,
HAProxy (deploy/haproxy) in front of the generator's two doors, as a deployment runs them.

    keys = make_keys(root, victim="bench", uploader="uploader")
    async with secured(stack, "alone", model, tok, docs, keys) as (doors, pipeline):
        ...  # doors.grpc / doors.http: the proxy's; doors.retriever: the retriever's own (Ingest)

A fresh stack per way (cold caches, data directories of its own); the corpus is ingested in-process from
the run's vector cache (no embedding), so what the encoder does during a way is the uploader's and the
victim's questions only. The generator keeps its own retrieval and draft-cache deadlines (2 s and 0.5 s by
default): a retrieval that waits past its deadline shows as an answer without documents.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead_rag.bench.haproxy_proxy import HaproxyProxy, ProxyConfig
from lookahead_rag.bench.hostile_mix import Doors
from lookahead_rag.bench.serve_stack import StackConfig, _start
from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.auth.keys import KeyFile
from lookahead_rag.services.common.auth.settings import ALL_TENANTS, AuthSettings
from lookahead_rag.services.common.rpc.grpcutil import local_target
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.http.settings import HttpSettings
from lookahead_rag.services.retriever.documents import Document

ANSWER_SCOPES = ("answer",)  # the victim's key: questions only
WRITE_SCOPES = ("answer", "write")  # the uploader's key: it may ingest
PROXY_ROUTING = "tenant"  # the proxy's routing (one replica here: what counts is its caps and timeouts)
DEADLINES = ("retrieve_timeout_s", "fetch_timeout_s")  # the generator's deadlines on its dependencies, kept


@dataclass(frozen=True)
class Keys:
    """The run's API keys (one keys file), each shown once by ``KeyFile.add``."""

    path: Path  # the keys file the services read
    victim: str  # the victim tenant's key (answer)
    uploader: str  # the uploader tenant's key (answer, write)
    service: str  # the services' own key (every tenant): generator -> retriever, draft cache


def make_keys(root: Path, victim: str, uploader: str) -> Keys:
    """A keys file under ``root`` with one key per caller."""
    keys = KeyFile(root / "keys.json")
    _, service = keys.add([ALL_TENANTS], "services")
    _, victim_key = keys.add([victim], "victim", ANSWER_SCOPES)
    _, uploader_key = keys.add([uploader], "uploader", WRITE_SCOPES)
    return Keys(keys.path, victim_key, uploader_key, service)


def default_deadlines() -> dict[str, Any]:
    """The generator's own deadlines on retrieval and the draft cache (bench serve raises them: not here)."""
    return {name: GeneratorSettings.model_fields[name].default for name in DEADLINES}


def secured_settings(cfg: StackConfig, name: str, keys: Keys) -> Any:
    """``cfg``'s stack settings with keys required, the OpenAI door on (any free port) and the generator's
    default deadlines."""
    base = cfg.settings(name)
    return dataclasses.replace(
        base,
        generator=base.generator.model_copy(update=default_deadlines()),
        auth=AuthSettings(mode="required", keys_file=keys.path, service_key=keys.service),
        http=HttpSettings(enabled=True, port=0),
    )


@asynccontextmanager
async def secured(cfg: StackConfig, name: str, model: Any, tokenizer: Any, docs: dict[str, list[Document]],
                  keys: Keys) -> AsyncIterator[tuple[Doors, Pipeline]]:
    """A fresh stack with the corpus ingested and the proxy in front; both stop on exit."""
    settings = secured_settings(cfg, name, keys)
    pipeline = await _start(settings, model, tokenizer)
    proxy = None
    try:
        for tenant, tenant_docs in docs.items():
            await asyncio.to_thread(pipeline.retriever.ingest, tenant, tenant_docs)
        host = settings.generator.host
        grpc_door = local_target(host, pipeline.ports["generator"])
        http_door = local_target(settings.http.host, pipeline.http_port)
        proxy = HaproxyProxy(ProxyConfig([grpc_door], [http_door], PROXY_ROUTING, log=cfg.root / f"{name}.haproxy.log"))
        await asyncio.to_thread(proxy.start)
        retriever = local_target(settings.retriever.host, pipeline.ports["retriever"])
        yield Doors(proxy.grpc_target, proxy.http_base, retriever, "haproxy (deploy/haproxy/haproxy.cfg)"), pipeline
    finally:
        if proxy is not None:
            proxy.stop()
        await pipeline.stop()
