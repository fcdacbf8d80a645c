"""Pipeline overhead: the same questions answered in-process and through the three gRPC services.

Two pipelines share the loaded model; each has its own fresh state. Questions alternate between
them (noise is shared), both feed their own event bus, so their caches evolve identically; the
time is the client's end-to-end wall time of each Answer (retrieval, drafts, decoding, streaming).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from typing import Any

from lookahead_rag.bench.sampling_args import Sampling
from lookahead_rag.bench.serve_client import generation_params
from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.common.rpc.grpcutil import open_channel
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.generator.convert import answer_query
from lookahead_rag.services.generator.domain import FinalInfo
from lookahead_rag.v1 import generator_pb2, generator_pb2_grpc

TENANT = "bench"
PERCENT = 100.0


def _settings(root: str, max_new: int) -> AllSettings:
    return AllSettings.load(
        None,
        generator={"data_dir": f"{root}/g", "port": 0},
        limits={"default_max_new_tokens": max_new, "max_new_tokens": max(max_new, 512)},
        retriever={"data_dir": f"{root}/r", "port": 0}, draftcache={"data_dir": f"{root}/d", "port": 0},
        kafka={"bootstrap_servers": ""}, http={"enabled": False},  # gRPC overhead only
    )


def _request(question: str, k: int, params: Any) -> Any:
    return generator_pb2.AnswerRequest(tenant=TENANT, question=question, k=k, params=params)


async def _answer_local(p: Pipeline, question: str, k: int, params: Any) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out: list[int] = []
    async for chunk in p.generator.answer(answer_query(_request(question, k, params))):  # the engine's domain types
        if isinstance(chunk, FinalInfo):
            out = list(chunk.output_ids)
    return time.perf_counter() - t0, out


async def _answer_grpc(stub: Any, question: str, k: int, params: Any) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out: list[int] = []
    async for chunk in stub.Answer(_request(question, k, params)):
        if chunk.HasField("final"):
            out = list(chunk.final.output_ids)
    return time.perf_counter() - t0, out


async def measure_pipeline(model: Any, tokenizer: Any, docs: list[Any], questions: list[str], k: int,
                           max_new: int, sampling: Sampling | None = None) -> dict[str, Any]:
    """{"in_process_wall_s", "grpc_wall_s", "overhead_frac", "same_outputs", "retrieval": {...}}.

    With sampling, both sides send the same temperature / top-p / top-k and seed (same outputs expected)."""
    params = generation_params("", max_new, sampling) if sampling is not None and sampling.enabled else None
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        local = await Pipeline.start(_settings(a, max_new), model=model, tokenizer=tokenizer)
        remote = await Pipeline.start(_settings(b, max_new), grpc_servers=True, model=model, tokenizer=tokenizer)
        channel = open_channel(f"127.0.0.1:{remote.ports['generator']}")
        stub = generator_pb2_grpc.GeneratorStub(channel)
        try:
            for p in (local, remote):
                await asyncio.to_thread(p.retriever.ingest, TENANT, docs)
            retrieve_ms = []
            for q in questions:  # retrieval latency alone (embedding + FAISS), in-process
                t0 = time.perf_counter()
                await asyncio.to_thread(local.retriever.retrieve, TENANT, q, k, 0, max_new)
                retrieve_ms.append((time.perf_counter() - t0) * 1000)
            t_local = t_grpc = 0.0
            same = 0
            for q in questions:
                dt, out_a = await _answer_local(local, q, k, params)
                t_local += dt
                dt, out_b = await _answer_grpc(stub, q, k, params)
                t_grpc += dt
                same += int(out_a == out_b)
                await local.bus.drain(30)
                await remote.bus.drain(30)
            chunks = local.retriever.stats(TENANT).chunks
        finally:
            await channel.close()
            await remote.stop()
            await local.stop()
    ms = sorted(retrieve_ms)
    return {
        "pipeline": {
            "in_process_wall_s": round(t_local, 3), "grpc_wall_s": round(t_grpc, 3),
            "overhead_frac": round((t_grpc - t_local) / t_local, 4) if t_local else None,
            "same_outputs": same / len(questions) if questions else None,
        },
        "retrieval": {
            "chunks": chunks, "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        },
        "overhead_percent": round(PERCENT * (t_grpc - t_local) / t_local, 2) if t_local else None,
    }
