"""Helpers for the generator / pipeline tests: a Pipeline on real gRPC (loopback, port 0) driven
from async tests (pytest-asyncio).

    @module_loop                                          # the module's loop: its pipelines live there
    async def test_answer(tmp_path):
        async with running_pipeline(tmp_path, generator={"max_running": 1}) as p:
            p.ingest("acme", DOCS)
            got = await p.answer("acme", "How do I pretty-print JSON?", max_new_tokens=32)
            assert got.final.output_ids == greedy(p.model, got.final.prompt_ids, 32)

The pipeline (grpc.aio servers, in-process bus) runs on the test's event loop; tests call it through
a grpc.aio channel. A module that shares a pipeline between its tests starts it in a module-scoped
async fixture, so its tests run on the module's loop (``module_loop``). Nothing in a test may block
the loop while it waits for the pipeline: waits poll (``wait_until``, ``ForwardGate.wait_reached``).
The model is loaded once per process and shared by every pipeline (engines share the scheduler's
kernel twins, built once per process; the stock model is the greedy baseline).
``RecordingPublisher`` (here) and ``ForwardGate``/``SubmitSpy`` (``tests.pipeline.spies``) are test
instruments attached to one pipeline's engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lookahead_rag.services.app import Pipeline
from lookahead_rag.services.config import AllSettings
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.v1 import events_pb2, generator_pb2, generator_pb2_grpc

CALL_TIMEOUT_S = 300.0  # generous: 2 shared cores; a hung call fails instead of stalling
STOP_TIMEOUT_S = 300.0  # the longest a pipeline's graceful stop may take
IDLE_TIMEOUT_S = 120.0  # waiting for the engine to finish in-flight work

DOCS = [
    Document(
        "json.dumps",
        "json.dumps(obj, indent=None)",
        "json.dumps(obj) serializes obj to a JSON formatted str. Use indent=2 to pretty-print the "
        "output with two spaces per level, and sort_keys=True to sort the keys of dictionaries.",
    ),
    Document(
        "csv.reader",
        "csv.reader(csvfile)",
        "csv.reader(csvfile) returns a reader object which iterates over lines in the given csvfile. "
        "Each row read from the csv file is returned as a list of strings.",
    ),
    Document(
        "pathlib.Path",
        "pathlib.Path(*segments)",
        "pathlib.Path represents a filesystem path. Path.read_text() returns the decoded contents of "
        "the file as a string; Path.exists() tells whether the path points to an existing file.",
    ),
]
QUESTION = "How do I pretty-print JSON with json.dumps?"

# The mark for a test that shares its module's event loop, where the module's pipeline fixtures
# (scope="module", loop_scope="module") run: ``pytestmark = module_loop`` or ``@module_loop``.
module_loop = pytest.mark.asyncio(loop_scope="module")


@functools.cache
def shared_model() -> tuple[Any, Any]:
    """(stock SmolLM2 model, tokenizer), loaded once per process (a cached fp32 copy: seconds)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lookahead_core.models import load_model

    return load_model()


def greedy(model: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding of ``prompt_ids`` by the stock model (``generate``, no drafts)."""
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # [1, prompt]
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )  # [1, prompt + new]
    return out[0, ids.shape[1]:].tolist()


def unique_tenant(hint: str) -> str:
    """A tenant name no other test uses (tests never see each other's sessions or drafts)."""
    safe = "".join(ch if ch.isalnum() else "-" for ch in hint)[:60]
    return f"{safe}-{uuid.uuid4().hex[:8]}"


# Timeouts far above what a loaded 2-core machine needs: only the fault tests shorten them.
ROBUST_GENERATOR = {"retrieve_timeout_s": 120.0, "fetch_timeout_s": 120.0, "shutdown_grace_s": 120.0}
# Draft budgets and kernel choice that do not depend on timings taken on a loaded machine (adaptive
# budgets are covered by tests/core/test_core_scheduler.py); a test about them sets them back.
DETERMINISTIC_GENERATOR = {"adaptive_speculation": False, "calibrate_kernels": False}


def pipeline_settings(root: Path, **sections: dict[str, Any]) -> AllSettings:
    """Settings for a test pipeline: temp data dirs, any free port, no metrics, in-process bus."""
    gen = {"data_dir": root / "generator", "port": 0, "metrics_port": None, **ROBUST_GENERATOR,
           **DETERMINISTIC_GENERATOR, **sections.get("generator", {})}
    server = {"port": 0, "metrics_port": None, "shutdown_grace_s": ROBUST_GENERATOR["shutdown_grace_s"]}
    ret = {"data_dir": root / "retriever", **server, **sections.get("retriever", {})}
    dc = {"data_dir": root / "draftcache", **server, "snapshot_interval_s": 0, **sections.get("draftcache", {})}
    kafka = {"bootstrap_servers": "", **sections.get("kafka", {})}
    http = {"port": 0, **sections.get("http", {})}  # the OpenAI-compatible endpoint, beside the gRPC servers
    return AllSettings.load(None, generator=gen, retriever=ret, draftcache=dc, limits=sections.get("limits", {}),
                            kafka=kafka, http=http, auth=sections.get("auth", {}))


def module_pipeline(**sections: dict[str, Any]) -> Any:
    """A module-scoped fixture: one pipeline with these settings sections for all the module's tests
    (its name is the name it is assigned to: ``small = module_pipeline(generator={"max_running": 1})``)."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def pipeline(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningPipeline]:
        async with running_pipeline(tmp_path_factory.mktemp("pipeline"), **sections) as p:
            yield p

    return pipeline


@contextlib.asynccontextmanager
async def running_pipeline(root: Path, **sections: dict[str, Any]) -> AsyncIterator[RunningPipeline]:
    """A pipeline started on the running event loop; stopped (gracefully) on exit."""
    pipeline = await RunningPipeline.start(pipeline_settings(root, **sections))
    try:
        yield pipeline
    finally:
        await pipeline.stop()


class RecordingPublisher:
    """Wraps the engine's publisher: records every GenerationCompleted before passing it on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.events: list[events_pb2.GenerationCompleted] = []
        self._lock = threading.Lock()

    def publish(self, event: events_pb2.GenerationCompleted) -> None:
        copy = events_pb2.GenerationCompleted()
        copy.CopyFrom(event)
        with self._lock:
            self.events.append(copy)
        self.inner.publish(event)

    def for_tenant(self, tenant: str) -> list[events_pb2.GenerationCompleted]:
        with self._lock:
            return [e for e in self.events if e.tenant == tenant]


@dataclass
class Answered:
    """One streamed reply: its deltas and the final message."""

    deltas: list[generator_pb2.TextDelta] = field(default_factory=list)
    final: generator_pb2.FinalInfo | None = None

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def streamed_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d.token_ids]


async def collect(call: Any) -> Answered:
    """Read a stream (a grpc.aio call) to its end; exactly one final message must come, and it must
    come last. Raises the call's ``grpc.RpcError`` when it ends with an error status."""
    got = Answered()
    while (chunk := await call.read()) is not grpc.aio.EOF:
        assert got.final is None, "a message came after the final one"
        if chunk.HasField("final"):
            got.final = chunk.final
        else:
            assert chunk.HasField("delta"), chunk
            got.deltas.append(chunk.delta)
    assert got.final is not None, "the stream ended without a final message"
    return got


def params(**kw: Any) -> generator_pb2.GenerationParams:
    return generator_pb2.GenerationParams(**kw)


@dataclass
class RunningPipeline:
    """A started Pipeline (gRPC servers) plus a grpc.aio channel to its generator."""

    pipeline: Pipeline
    channel: grpc.aio.Channel
    stub: generator_pb2_grpc.GeneratorStub
    events: RecordingPublisher
    model: Any
    tokenizer: Any
    stopping: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, settings: AllSettings) -> RunningPipeline:
        model, tokenizer = shared_model()
        pipeline = await Pipeline.start(settings, grpc_servers=True, model=model, tokenizer=tokenizer)
        recorder = RecordingPublisher(pipeline.generator.publisher)
        pipeline.generator.publisher = recorder
        channel = grpc.aio.insecure_channel(cls._target(pipeline, "generator"))
        return cls(pipeline, channel, generator_pb2_grpc.GeneratorStub(channel), recorder, model, tokenizer)

    @staticmethod
    def _target(pipeline: Pipeline, service: str) -> str:
        return f"127.0.0.1:{pipeline.ports[service]}"

    def target(self, service: str = "generator") -> str:
        return self._target(self.pipeline, service)

    @property
    def generator(self) -> Any:
        return self.pipeline.generator

    def begin_stop(self) -> asyncio.Task[None]:
        """Start ``Pipeline.stop()`` (graceful) as a task; ``stop()`` waits for it, never runs it again."""
        if self.stopping is None:
            self.stopping = asyncio.ensure_future(self.pipeline.stop())
        return self.stopping

    async def stop(self) -> None:
        await self.channel.close()
        await asyncio.wait_for(self.begin_stop(), STOP_TIMEOUT_S)

    # ---- calls --------------------------------------------------------------------------------
    def ingest(self, tenant: str, docs: Sequence[Document] = DOCS) -> None:
        self.pipeline.retriever.ingest(tenant, list(docs))

    def new_tenant(self, hint: str) -> str:
        """A tenant of its own (``unique_tenant``) with ``DOCS`` ingested."""
        tenant = unique_tenant(hint)
        self.ingest(tenant)
        return tenant

    def answer_request(self, tenant: str, question: str = QUESTION, k: int = 0, m: int = 0,
                       **gen: Any) -> generator_pb2.AnswerRequest:
        return generator_pb2.AnswerRequest(tenant=tenant, question=question, k=k, m=m, params=params(**gen))

    async def answer(self, tenant: str, question: str = QUESTION, k: int = 0, m: int = 0,
                     timeout: float = CALL_TIMEOUT_S, **gen: Any) -> Answered:
        return await collect(self.stub.Answer(self.answer_request(tenant, question, k, m, **gen), timeout=timeout))

    async def generate(self, request: generator_pb2.GenerateRequest, timeout: float = CALL_TIMEOUT_S) -> Answered:
        return await collect(self.stub.Generate(request, timeout=timeout))

    async def drain(self) -> None:
        """Wait until every published event reached the draft cache and the past sessions."""
        await self.pipeline.bus.drain(60)

    # ---- state --------------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        """Requests waiting or running in the engine's scheduler."""
        return int(self.generator.inflight)

    async def wait_idle(self, timeout: float = IDLE_TIMEOUT_S) -> int:
        """Wait until no request is in flight in the engine; returns the in-flight count then."""
        await wait_until(lambda: self.inflight == 0, timeout)
        return self.inflight

    async def health(self, service: str, target: str | None = None) -> int:
        async with grpc.aio.insecure_channel(target or self.target()) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)).status


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = IDLE_TIMEOUT_S) -> bool:
    """Poll ``predicate`` (plain or async) until it holds (True) or ``timeout`` passes (False); the
    event loop runs on between polls."""
    end = time.monotonic() + timeout
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return True
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.02)


async def rpc_error(call: Callable[[], Awaitable[Any]]) -> grpc.RpcError:
    """The RpcError awaiting ``call()`` raises (an AssertionError when it succeeds)."""
    try:
        await call()
    except grpc.RpcError as err:
        return err
    raise AssertionError("the call succeeded; an error status was expected")


def assert_status(err: grpc.RpcError, code: grpc.StatusCode, *words: str) -> None:
    """``err`` has status ``code`` and a one-line message containing each of ``words``."""
    details = err.details() or ""  # type: ignore[attr-defined]
    assert err.code() == code, (err.code(), details)  # type: ignore[attr-defined]
    assert details.strip(), "the status has no message"
    assert "\n" not in details, f"message is not one line: {details!r}"
    for word in words:
        assert word.lower() in details.lower(), (word, details)
