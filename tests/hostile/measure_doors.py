"""The figures of issue 32 items 1 and 2, on this machine (not a test: run it by hand, before and after).

    HF_HUB_OFFLINE=1 python -m tests.hostile.measure_doors

Item 1: seconds until the body of 120,000 empty messages (n=16, no retrieval) is answered, and a
concurrent tenant's longest gap between two stream events (its longest gap alone beside it). Item 2: the
distinct sizes of a safe-stream tenant's delta events on each streamed door (or its refusal's status).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from lookahead_rag.v1 import generator_pb2
from tests.pipeline.helpers import QUESTION, RunningPipeline, params, running_pipeline, unique_tenant

SAFE = unique_tenant("measure-safe")
TOKENS = 48  # the victim's answer, and each door's
EMPTY = 120_000
DOORS = {  # name -> (path, body)
    "chat n=1": ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}),
    "chat n=2": ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}], "n": 2,
                                          "temperature": 1.0}),
    "completions n=1": ("/v1/completions", {"prompt": "The three primary colours are"}),
}


def url(p: RunningPipeline) -> str:
    return f"http://127.0.0.1:{p.pipeline.http_port}"


async def victim_gaps(p: RunningPipeline, tenant: str, started: asyncio.Event | None = None) -> float:
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, "max_tokens": TOKENS}
    times = []
    async with httpx2.AsyncClient(base_url=url(p), timeout=600) as http, \
            http.stream("POST", "/v1/chat/completions", json=body, headers={"x-tenant": tenant}) as response:
        async for _ in response.aiter_lines():
            times.append(time.monotonic())
            if started is not None:
                started.set()
    return max(b - a for a, b in itertools.pairwise(times[1:]))


async def item1(p: RunningPipeline) -> None:
    victim, evil = unique_tenant("measure-victim"), unique_tenant("measure-evil")
    p.ingest(victim)
    alone = await victim_gaps(p, victim)
    started = asyncio.Event()
    beside = asyncio.create_task(victim_gaps(p, victim, started))
    await started.wait()
    body = {"messages": [{"role": "user"}] * EMPTY, "n": 16, "temperature": 1.0, "rag": False, "max_tokens": 4}
    async with httpx2.AsyncClient(base_url=url(p), timeout=600) as http:
        start = time.monotonic()
        response = await http.post("/v1/chat/completions", json=body, headers={"x-tenant": evil})
        took = time.monotonic() - start
    gap = await beside
    print(f"item 1: {len(json.dumps(body)) / 1e6:.1f} MB body -> {response.status_code} after {took:.2f} s; "
          f"victim's longest gap {gap:.2f} s (alone {alone:.2f} s)")


def delta_sizes(raw: bytes) -> list[int]:
    sizes = []
    for event in raw.split(b"\n\n"):
        payload = event.removeprefix(b"data: ").strip()
        if not payload or payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        if obj.get("choices") and all(c.get("finish_reason") is None for c in obj["choices"]):
            sizes.append(len(event) + 2)
    return sizes


async def item2(p: RunningPipeline) -> None:
    p.ingest(SAFE)
    async with httpx2.AsyncClient(base_url=url(p), timeout=600) as http:
        for name, (path, body) in DOORS.items():
            full = {**body, "stream": True, "max_tokens": TOKENS}
            response = await http.post(path, json=full, headers={"x-tenant": SAFE})
            sizes = sorted(set(delta_sizes(response.content))) if response.status_code == 200 else []
            print(f"item 2: {name}: status {response.status_code}, {len(sizes)} delta event sizes {sizes}")
    request = generator_pb2.AnswerRequest(tenant=SAFE, question=QUESTION, params=params(max_new_tokens=TOKENS))
    sizes_grpc = {c.ByteSize() async for c in p.stub.Answer(request) if c.HasField("delta")}
    print(f"item 2: gRPC Answer: {len(sizes_grpc)} delta message sizes {sorted(sizes_grpc)}")


async def main() -> None:
    generator: dict[str, Any] = {"safe_stream_tenants": [SAFE], "safe_stream_interval_ms": 50.0}
    async with running_pipeline(Path(tempfile.mkdtemp()), generator=generator) as p:
        await item1(p)
        await item2(p)


if __name__ == "__main__":
    asyncio.run(main())
