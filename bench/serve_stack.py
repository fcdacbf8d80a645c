"""bench-serve's services: a fresh set of the three gRPC services per (level, way), one loaded model.

Each stack gets its own data directories (fresh caches and past sessions) and, with Kafka, its
own topic and consumer groups, so every way starts cold. The corpus is embedded once into a
vector cache that every stack's retriever reads, so ingesting is a FAISS add, not a re-embedding.
"""

from __future__ import annotations

import asyncio
import resource
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.rpc.grpcutil import local_target, open_channel
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.retriever.documents import Document, make_chunks
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.vector_cache import VectorCache
from lookahead_rag.v1 import generator_pb2_grpc

KIB = 1024
RSS_POLL_S = 0.2  # how often the resident-memory sampler looks


@dataclass
class StackConfig:
    """What every stack of one benchmark run shares."""

    root: Path  # temp folder: one subfolder per stack
    model: str  # served model name (generator + retriever tokenizer)
    max_new_tokens: int  # tokens each request asks for
    max_concurrency: int  # the highest concurrency level of the run
    threads: int  # torch CPU threads of the engine (0 = every core this process may use)
    timeout_s: float  # retrieve and fetch deadlines inside the generator (generous: never degrade)
    kafka: str = ""  # bootstrap HOST:PORT; empty = the in-process bus
    generator: dict[str, Any] = field(default_factory=dict)  # extra generator settings (--gen KEY=VALUE)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # keeps Kafka topics apart between runs
    def generator_settings(self, data_dir: Path) -> dict[str, Any]:
        """Generous generator settings (deadlines, capacity at least the highest concurrency level)."""
        known = GeneratorSettings.model_fields
        wanted: dict[str, Any] = {
            "data_dir": data_dir, "port": 0, "threads": self.threads,
            "retrieve_timeout_s": self.timeout_s, "fetch_timeout_s": self.timeout_s,
        }
        at_least = {  # capacity settings: the field's default, raised to what the run needs
            "max_running": self.max_concurrency,  # the serving engine: batched together
            "max_waiting": self.max_concurrency,  # ... queued past max_running
        }
        for name, need in at_least.items():
            default = known[name].default
            wanted[name] = max(need, default) if isinstance(default, int) else need
        return wanted | self.generator

    def limits(self) -> dict[str, Any]:
        """Every request asks for max_new_tokens (the default), within the limit."""
        limit = max(self.max_new_tokens, RequestLimits.model_fields["max_new_tokens"].default)
        return {"default_max_new_tokens": self.max_new_tokens, "max_new_tokens": limit}

    def tls(self) -> dict[str, Any]:
        """``[tls]`` for a stack over TLS: its servers present a run-time CA's certificate, and its
        clients (the generator's channels, the benchmark's) verify it. The CA is made once per run."""
        from lookahead_rag.services.common.auth.devpki import (
            make_pki,  # the cryptography package: only for the on_tls way
        )

        directory = self.root / "pki"
        if not (directory / "server.crt").exists():
            directory.mkdir(parents=True, exist_ok=True)
            make_pki(directory)
        return {"cert_file": directory / "server.crt", "key_file": directory / "server.key",
                "ca_file": directory / "ca.crt"}

    def settings(self, name: str, tls: bool = False) -> AllSettings:
        base = self.root / name
        kafka: dict[str, Any] = {"bootstrap_servers": self.kafka}
        if self.kafka:
            prefix = f"bench-serve.{self.run_id}.{name}"
            kafka |= {"topic": prefix, "draftcache_group": f"{prefix}.draftcache",
                      "retriever_group": f"{prefix}.retriever", "group_prefix": f"{prefix}."}
        return AllSettings.load(
            None, model={"name": self.model}, generator=self.generator_settings(base / "g"),
            retriever={"data_dir": base / "r", "port": 0,
                       "vector_cache": self.root / "vectors.npz"},
            draftcache={"data_dir": base / "d", "port": 0}, limits=self.limits(), kafka=kafka,
            http={"enabled": False},  # the benchmark's clients speak gRPC
            tls=self.tls() if tls else {},
        )


def check_generator_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> a dict; KEY must be a GeneratorSettings field (validated on load)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in GeneratorSettings.model_fields:
            raise SystemExit(f"--gen {pair!r}: not KEY=VALUE with KEY in {sorted(GeneratorSettings.model_fields)}")
        out[key] = value
    return out


def build_vector_cache(cfg: StackConfig, docs: dict[str, list[Document]]) -> int:
    """Embed every chunk of the corpus once into ``root/vectors.npz``; returns the chunk count."""

    rs = cfg.settings("probe").retriever
    texts = list(dict.fromkeys(c.embedding_text() for ds in docs.values() for d in ds
                               for c in make_chunks(d, rs.chunk_chars, rs.chunk_overlap)))
    embedder = Embedder(rs.embedder_path, batch_size=rs.embed_batch_size, progress_min_texts=1)
    (cfg.root / "vectors.npz").write_bytes(VectorCache.build(embedder.name, texts, embedder.encode(texts)).to_bytes())
    return len(texts)


async def _start(settings: AllSettings, model: Any, tokenizer: Any) -> Pipeline:
    """Pipeline.start, let finish even when cancelled (Ctrl-C), so that the servers it started are stopped."""
    task = asyncio.ensure_future(Pipeline.start(settings, grpc_servers=True, model=model, tokenizer=tokenizer))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        pipeline = await task
        await pipeline.stop()
        raise


@asynccontextmanager
async def serving(cfg: StackConfig, name: str, model: Any, tokenizer: Any,
                  docs: dict[str, list[Document]], tls: bool = False) -> AsyncIterator[tuple[Any, Pipeline]]:
    """A GeneratorStub to a fresh stack with the corpus ingested (over TLS with ``tls``), and the stack
    itself (its engine's steps can be profiled); the servers stop on exit (or Ctrl-C)."""
    settings = cfg.settings(name, tls)
    pipeline = await _start(settings, model, tokenizer)
    channel = None
    try:
        for tenant, tenant_docs in docs.items():
            await asyncio.to_thread(pipeline.retriever.ingest, tenant, tenant_docs)
        gs = settings.generator
        channel = open_channel(local_target(gs.host, pipeline.ports["generator"]), gs.max_message_bytes,
                               settings.tls if tls else None)
        yield generator_pb2_grpc.GeneratorStub(channel), pipeline
    finally:
        if channel is not None:
            await channel.close()
        await pipeline.stop()


def rss_mb() -> float:
    """This process's resident memory now (VmRSS), or its peak where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / KIB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB


class RssSampler:
    """The highest resident memory seen while the ``async with`` block runs."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, rss_mb())
            await asyncio.sleep(RSS_POLL_S)

    async def __aenter__(self) -> RssSampler:
        self.peak_mb = rss_mb()
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.peak_mb = max(self.peak_mb, rss_mb())
