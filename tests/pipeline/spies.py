"""Spies on a running pipeline's scheduler and clients: hold a forward, see submits, record timeouts;
``held_answer``: one Answer holding the engine's running place while a test queues others."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.forward.kernels import KernelSet

from tests.pipeline.helpers import CALL_TIMEOUT_S, Answered, RunningPipeline, collect, greedy, wait_until

GATE_TIMEOUT_S = 120.0  # a gated forward proceeds after this even if never released


class ForwardGate:
    """Counts the engine's batched forwards; the ``block_at``-th one waits until ``release()``.

    A request alone in the engine has one forward for its prefill (a prompt of at most
    ``prefill_chunk`` tokens), then one per step. Blocking a forward blocks the scheduler thread:
    every running request is held in flight and newcomers stay in the queue, deterministically (no
    timing involved). Every twin of the scheduler's KernelSet is watched (each forward runs through
    one of them). Use as a context manager.
    """

    def __init__(self, kernels: KernelSet, block_at: int = 0) -> None:
        self.runners = list(kernels.twins.values())
        self.block_at = block_at
        self.calls = 0
        self.reached = threading.Event()  # the blocked forward has started and waits
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._handles: list[Any] = []

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        with self._lock:
            self.calls += 1
            n = self.calls
        if n == self.block_at:
            self.reached.set()
            self.released.wait(GATE_TIMEOUT_S)

    def release(self) -> None:
        self.released.set()

    async def wait_reached(self, timeout: float = GATE_TIMEOUT_S) -> bool:
        """Whether the blocked forward started within ``timeout`` (polled: the event loop runs on)."""
        return await wait_until(self.reached.is_set, timeout)

    def __enter__(self) -> ForwardGate:
        self._handles = [runner.register_forward_pre_hook(self._hook) for runner in self.runners]
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        for handle in self._handles:
            handle.remove()


class SubmitSpy:
    """Records every ServeRequest the engine hands to its scheduler (``scheduler.submit``)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.requests: list[ServeRequest] = []
        self._orig = scheduler.submit
        self._lock = threading.Lock()

    def _submit(self, req: ServeRequest) -> None:
        self._orig(req)  # a request refused here (QueueFull) is not recorded: it never waited
        with self._lock:
            self.requests.append(req)

    def __enter__(self) -> SubmitSpy:
        self.scheduler.submit = self._submit  # instance attribute shadows the method
        return self

    def __exit__(self, *exc: object) -> None:
        del self.scheduler.submit

    def last(self) -> ServeRequest | None:
        with self._lock:
            return self.requests[-1] if self.requests else None


def ended(req: ServeRequest) -> bool:
    """Whether the scheduler is done with ``req`` (its place and cache are freed)."""
    return req.phase is Phase.DONE


class TimeoutRecorder:
    """Wraps the engine's retriever or draft client: records the timeout of every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.timeouts: list[float] = []

    async def retrieve(self, *args: Any) -> Any:
        self.timeouts.append(float(args[-1]))  # (tenant, question, k, m, max_new_tokens, timeout_s)
        return await self.inner.retrieve(*args)

    async def fetch(self, *args: Any) -> Any:
        self.timeouts.append(float(args[-1]))  # (tenant, tokenizer_id, prompt, refs, budget, timeout_s)
        return await self.inner.fetch(*args)


@dataclass
class Held:
    """An Answer running in the engine, held at its second forward (``held_answer``)."""

    first: Any  # its first chunk: the prefill's token
    gate: ForwardGate  # holds the scheduler thread (running requests stay running, newcomers queued)
    spy: SubmitSpy  # every request submitted meanwhile (the held one first)
    rest: Answered | None = None  # the rest of the answer, read once the gate opened


@contextlib.asynccontextmanager
async def held_answer(p: RunningPipeline, tenant: str, n: int) -> AsyncIterator[Held]:
    """An Answer of ``n`` tokens for ``tenant`` started and held at its second forward; on exit the gate
    opens and the held answer, read to its end, must be exactly plain greedy decoding of its prompt
    (whatever the test queued or had refused meanwhile)."""
    scheduler = p.generator.scheduler
    with SubmitSpy(scheduler) as spy, ForwardGate(scheduler.backend.kernels, block_at=2) as gate:
        call = p.stub.Answer(p.answer_request(tenant, max_new_tokens=n), timeout=CALL_TIMEOUT_S)
        held = Held(await call.read(), gate, spy)
        assert await gate.wait_reached()  # the held request's place is taken
        yield held
        gate.release()
        held.rest = await collect(call)
    final = held.rest.final
    assert final is not None
    ids = [*held.first.delta.token_ids, *held.rest.streamed_ids]
    assert ids == list(final.output_ids) == greedy(p.model, final.prompt_ids, n)
