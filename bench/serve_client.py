"""bench-serve's closed-loop clients: c coroutines share one request sequence over one gRPC channel.

Each client takes the next request of the sequence as soon as its previous one ended (answered or
failed: a failure is recorded by its gRPC status name and the client goes on); every record says
which client sent it and in which order. A question is sent with ``Generator.Answer`` (the
retriever builds its prompt); a replayed prompt (``--replay``) with ``Generator.Generate`` and its
token ids as they are. A sampling request whose final stats say greedy, or another seed, is
recorded as the error ``NOT_SAMPLED``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from tqdm import tqdm

from lookahead_rag.bench.sampling_args import Sampling
from lookahead_rag.bench.serve_load import Question, ReplayPrompt
from lookahead_rag.bench.serve_stats import SERVER_FIELDS, EngineStats, RequestRecord
from lookahead_rag.services.common.rpc.tenant_route import tenant_metadata
from lookahead_rag.services.common.telemetry.logs import REQUEST_ID_HEADER
from lookahead_rag.v1 import generator_pb2


def engine_stats(stats: Any) -> EngineStats:
    """FinalInfo.stats -> EngineStats; fields the generated code lacks read as 0."""
    return EngineStats(
        new_tokens=stats.new_tokens, forward_steps=stats.forward_steps,
        tokens_per_forward=float(getattr(stats, "mean_tokens_per_forward", 0.0)),
        prefix_hit_tokens=int(getattr(stats, "prefix_hit_tokens", 0)),
        queue_wait_s=float(getattr(stats, "queue_wait_s", 0.0)),
        mean_batch_size=float(getattr(stats, "mean_batch_size", 0.0)),
        server={f: getattr(stats, f) for f in SERVER_FIELDS if hasattr(stats, f)},
    )


def generation_params(mode: str, max_new: int, sampling: Sampling | None = None, safe_stream: bool = False) -> Any:
    """GenerationParams of every request: greedy ones as before (no sampling field set); sampling ones
    carry temperature, top_p, top_k and the run's one seed; ``safe_stream`` asks for the safe stream."""
    params = generator_pb2.GenerationParams(max_new_tokens=max_new, mode=mode, safe_stream=safe_stream)
    if sampling is not None and sampling.enabled:
        params.temperature, params.top_p, params.top_k = sampling.temperature, sampling.top_p, sampling.top_k
        params.seed = sampling.seed
    return params


def sampling_mismatch(stats: Any, sampling: Sampling | None) -> str | None:
    """``NOT_SAMPLED`` when a sampling request came back greedy or with another seed (the server ignored
    its params: no figure of that run means anything), else None."""
    if sampling is None or not sampling.enabled:
        return None
    if not getattr(stats, "sampled", False) or getattr(stats, "seed", sampling.seed) != sampling.seed:
        return "NOT_SAMPLED"
    return None


def _call(stub: Any, q: Question | ReplayPrompt, params: Any, deadline_s: float, request_id: str) -> Any:
    """The request's stream: Answer for a question, Generate with the prompt's ids for a replayed prompt; its
    tenant also goes as ``x-tenant`` metadata, which a proxy in front of replicas routes on."""
    metadata = (*tenant_metadata(q.tenant), (REQUEST_ID_HEADER, request_id))
    if isinstance(q, ReplayPrompt):
        ids = generator_pb2.TokenIds(ids=q.prompt_ids)
        return stub.Generate(generator_pb2.GenerateRequest(tenant=q.tenant, prompt_ids=ids, params=params),
                             timeout=deadline_s, metadata=metadata)
    return stub.Answer(generator_pb2.AnswerRequest(tenant=q.tenant, question=q.question, params=params),
                       timeout=deadline_s, metadata=metadata)


# a stream that fails with one of these before its first token never produced anything: sent again
# (a replica that died or was cut off behind the proxy); once a token has streamed, never
RETRY_BEFORE_FIRST_TOKEN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                      grpc.StatusCode.UNKNOWN})


async def one_request(stub: Any, index: int, q: Question | ReplayPrompt, mode: str, max_new: int,
                      deadline_s: float, sampling: Sampling | None = None, safe_stream: bool = False,
                      attempts: int = 1) -> RequestRecord:
    """Send one request and time its stream (a safe stream's final has no ids: the streamed ones count,
    and a replayed prompt's are the ones sent). Up to ``attempts`` sends while it fails before its first
    token with a code in RETRY_BEFORE_FIRST_TOKEN; its TTFT counts from the first send."""
    params = generation_params(mode, max_new, sampling, safe_stream)
    streamed: list[int] = []
    sent = list(q.prompt_ids) if isinstance(q, ReplayPrompt) else []
    rec = RequestRecord(index, time.perf_counter(), request_id=uuid.uuid4().hex)
    while True:
        try:
            async for chunk in _call(stub, q, params, deadline_s, rec.request_id):
                now = time.perf_counter()
                if chunk.HasField("delta") and chunk.delta.token_ids:
                    rec.deltas.append((now, len(chunk.delta.token_ids)))
                    streamed += chunk.delta.token_ids
                elif chunk.HasField("final"):
                    final = chunk.final
                    rec.prompt_ids, rec.output_ids = list(final.prompt_ids or sent), list(final.output_ids or streamed)
                    rec.stats = engine_stats(final.stats)
                    rec.error = sampling_mismatch(final.stats, sampling)
        except grpc.aio.AioRpcError as exc:
            if not streamed and exc.code() in RETRY_BEFORE_FIRST_TOKEN and rec.retries + 1 < attempts:
                rec.retries += 1
                continue
            rec.error = exc.code().name
        except (grpc.RpcError, OSError, ValueError) as exc:
            rec.error = type(exc).__name__
        break
    rec.end_s = time.perf_counter()
    if rec.error is None and rec.stats is None:
        rec.error = "NO_FINAL"
    return rec


async def closed_loop(stub: Any, sequence: Sequence[Question | ReplayPrompt], concurrency: int, mode: str,
                      max_new: int, deadline_s: float, desc: str, sampling: Sampling | None = None,
                      safe_stream: bool = False, attempts: int = 1) -> tuple[list[RequestRecord], float]:
    """All requests of the sequence through ``concurrency`` clients; (records, wall seconds); ``attempts``
    as in ``one_request``."""
    todo: Iterator[tuple[int, Question | ReplayPrompt]] = iter(enumerate(sequence))  # shared: one loop, no lock
    records: list[RequestRecord] = []
    bar = tqdm(total=len(sequence), desc=desc, leave=False)

    async def client(k: int) -> None:
        for order, (index, q) in enumerate(todo):  # the shared iterator: this client's order-th request
            rec = await one_request(stub, index, q, mode, max_new, deadline_s, sampling, safe_stream, attempts)
            rec.client, rec.client_order = k, order
            records.append(rec)
            bar.update(1)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(client(k) for k in range(concurrency)))
    finally:
        bar.close()
    return sorted(records, key=lambda r: r.index), time.perf_counter() - t0
