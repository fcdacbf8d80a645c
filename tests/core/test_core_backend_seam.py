"""The backend seam (issue 50, item 1): the engine edits a request's KV only through its backend, and admission
counts the KV bytes the backend says a cache costs.

A recording backend wraps the engine's own: it hands out caches whose ``length`` may change only inside one of
its calls, and records each edit; a wrapper with a made-up ``kv_bytes`` shows admission and ``submit`` go by
that figure alone. The two real backends' figures: a CPU cache its entries, a pool slot the whole slot.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lookahead_core.engine
import pytest
import torch
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.backend import KVTooLong
from lookahead_core.forward.backend.base import GENERIC
from lookahead_core.forward.backend.edits import KVEdits
from lookahead_core.kv.kvstore import KV, KVShape, Pieces, RequestKV

from tests.core.helpers import StubTokenizer, eos_as, greedy, random_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

FIGURE = 1 << 30  # the made-up backend's bytes for any cache: far above what a tiny model's cache holds


class GuardedKV(RequestKV):
    """A cache whose ``length`` only its backend may change (while ``open``): any other write raises."""

    def __init__(self, shape: KVShape, capacity: int) -> None:
        self.open = True  # set while a backend call edits it (and while it is built)
        super().__init__(shape, capacity)
        self.open = False

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        if not self.open:
            raise AssertionError(f"KV length set to {n} outside the backend")
        self._length = n


class Recording:
    """The engine's backend, its caches guarded and every KV edit recorded by name (the rest delegated)."""

    def __init__(self, inner: Any, figure: int | None = None) -> None:
        self.inner = inner
        self.figure = figure  # kv_bytes of every cache (None: the inner backend's)
        self.edits: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def kv_for(self, capacity: int) -> RequestKV:
        return GuardedKV(self.inner.shape, capacity)

    def kv_bytes(self, capacity: int) -> int:
        return self.inner.kv_bytes(capacity) if self.figure is None else self.figure

    def run(self, packed: Any) -> torch.Tensor:
        return self._open_during("run", [seg.kv for seg in packed.attention.segments], packed)

    def keep(self, kv: RequestKV, past_len: int, kept: Sequence[int]) -> None:
        self._open_during("keep", [kv], kv, past_len, kept)

    def load_prefix(self, kv: RequestKV, pieces: Pieces, n: int) -> None:
        self._open_during("load_prefix", [kv], kv, pieces, n)

    def extend(self, kv: RequestKV, end: int) -> None:
        self._open_during("extend", [kv], kv, end)

    def prefix_views(self, kv: RequestKV, n: int) -> KV:
        return self._open_during("prefix_views", [kv], kv, n)

    def _open_during(self, name: str, caches: Sequence[Any], *args: Any) -> Any:
        self.edits.append(name)
        for kv in caches:
            kv.open = True
        try:
            return getattr(self.inner, name)(*args)
        finally:
            for kv in caches:
                kv.open = False


def plain(**cfg: Any) -> StepScheduler:
    """An engine over a tiny llama, its own backend as chosen, driven by ``step()``."""
    config = SchedulerConfig(**{"calibrate": False, "max_running": 4, "prefix_min_tokens": 4, **cfg})
    return StepScheduler(tiny_model("llama"), StubTokenizer(), config)  # type: ignore[arg-type]


def engine(figure: int | None = None, **cfg: Any) -> tuple[StepScheduler, Recording]:
    """A CPU engine whose backend is wrapped in a ``Recording`` (``figure``: its made-up kv_bytes)."""
    sched = plain(**cfg)
    sched.backend = recording = Recording(sched.backend, figure)  # type: ignore[assignment]
    return sched.start(thread=False), recording


def ask(prompt: Sequence[int], tenant: str = "t", max_new: int = 12) -> ServeRequest:
    return ServeRequest(list(prompt), DecodingConfig(max_new_tokens=max_new, decoding_length=6), tenant=tenant)


def drain(sched: StepScheduler) -> None:
    while sched.step():
        pass


def test_every_kv_edit_of_the_engine_goes_through_its_backend() -> None:
    # a prompt prefilled in chunks, decoded with trees, then asked again (a prefix-cache hit): every change of
    # its cache's length happens inside a backend call (a direct write raises and fails the request), each of
    # the four edits is used, and the tokens are greedy's
    sched, rec = engine(prefill_chunk=8)
    prompt = random_prompt(random.Random(3))
    with eos_as(sched.model, None):
        reqs = []
        for _ in range(2):
            reqs.append(req := ask(prompt))
            sched.submit(req)
            drain(sched)
        want = greedy(sched.model, prompt, 12)
    sched.close()
    assert all(r.error is None and r.output == want for r in reqs)
    assert reqs[1].stats.prefix_hit_tokens == len(prompt) - 1  # the repeat loaded its prefix
    assert {"keep", "load_prefix", "extend", "prefix_views"} <= set(rec.edits)


def test_admission_waits_on_the_backends_figure() -> None:
    # the backend says each cache costs FIGURE bytes and the budget holds two: of three tenants' requests two
    # start and one waits, though their caches' entries (capacity x bytes per entry) would fit all three
    sched, _ = engine(figure=FIGURE, kv_budget_bytes=2 * FIGURE, kv_tenant_share=1.0)
    reqs = [ask(random_prompt(random.Random(i)), tenant) for i, tenant in enumerate("abc")]
    for req in reqs:
        sched.submit(req)
    sched.step()
    assert len(sched.running) == 2 and len(sched.queue) == 1
    per_entry = KVShape.of(sched.model).bytes_per_token
    assert 3 * max(a.kv.capacity for a in sched.running) * per_entry < FIGURE  # counted by entries, all would fit
    assert sched.state().kv_bytes == 2 * FIGURE  # what the running requests hold, by the backend's figure
    drain(sched)
    sched.close()
    assert all(r.phase is Phase.DONE and r.error is None for r in reqs)


def test_submit_refuses_a_cache_the_backend_prices_past_a_tenants_share() -> None:
    # the backend's figure (FIGURE) is over a tenant's share of the budget (0.5 x 1.5 FIGURE): refused at submit,
    # though the request's entries would take a few KiB
    sched, _ = engine(figure=FIGURE, kv_budget_bytes=3 * FIGURE // 2)
    with pytest.raises(KVTooLong, match="tenant's running requests may hold"):
        sched.submit(ask(random_prompt(random.Random(1))))
    sched.close()


def test_a_cpu_cache_costs_its_entries_and_a_pool_slot_the_whole_slot() -> None:
    # the CPU backend's figure is capacity x bytes per entry (the cache it grants holds that); the generic one's
    # is a whole slot for any capacity, and the slot's cache says the same
    cpu, pooled = plain(), plain(backend=GENERIC, kv_slot_tokens=160)
    per_entry = KVShape.of(cpu.model).bytes_per_token
    assert cpu.backend.kv_bytes(50) == 50 * per_entry == cpu.backend.kv_for(50).nbytes
    slot = pooled.backend.pool.slot_bytes  # type: ignore[attr-defined]
    assert slot == 160 * per_entry
    assert pooled.backend.kv_bytes(1) == pooled.backend.kv_bytes(160) == slot
    assert pooled.backend.kv_for(50).nbytes == slot


def test_the_generic_backend_admits_by_whole_slots() -> None:
    # pool slots of 160 entries and a budget of two slots: of three tenants' short requests two start, one
    # waits, though the three capacities' entries fit in two slots' bytes
    slot = 160 * KVShape.of(tiny_model("llama")).bytes_per_token
    sched = plain(backend=GENERIC, kv_slot_tokens=160, kv_budget_bytes=2 * slot, kv_tenant_share=1.0).start(False)
    reqs = [ask(random_prompt(random.Random(i))[:16], tenant, max_new=4) for i, tenant in enumerate("abc")]
    for req in reqs:
        sched.submit(req)
    sched.step()
    capacities = [a.kv.capacity for a in sched.running]
    assert len(sched.running) == 2 and len(sched.queue) == 1
    assert 3 * max(capacities) * slot // 160 <= 2 * slot  # counted by their entries, all three would fit
    drain(sched)
    sched.close()
    assert all(r.phase is Phase.DONE and r.error is None for r in reqs)


def test_extend_makes_a_chunks_entries_valid_and_refuses_a_shrink_or_an_overflow() -> None:
    # extend moves length forward within capacity; backwards or past capacity is an error, length unchanged
    kv = RequestKV(KVShape(1, 1, 2, torch.float32, torch.device("cpu")), 8)
    edits = KVEdits()
    edits.extend(kv, 5)
    assert kv.length == 5
    for bad in (4, 9):
        with pytest.raises(ValueError, match="KV extend"):
            edits.extend(kv, bad)
    assert kv.length == 5


def test_the_engine_imports_no_kv_edit() -> None:
    # engine/ may name kvstore's types (RequestKV, KV, KVShape) but import none of its edit functions: each is
    # reached through the backend
    edits = {"compact", "load_prefix", "prefix_views"}
    found = []
    for path in sorted(Path(lookahead_core.engine.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("kvstore"):
                found += [f"{path.name}: {a.name}" for a in node.names if a.name in edits or a.name == "*"]
            elif isinstance(node, ast.Import | ast.ImportFrom) and any(a.name.endswith("kvstore") for a in node.names):
                found.append(f"{path.name}: the kvstore module")
    assert found == []
