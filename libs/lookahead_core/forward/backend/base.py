"""The narrow interface the engine sees of a forward backend (as vLLM's and SGLang's attention backends).

The engine imports this package's top (``forward.backend``: ``Backend``, ``BackendSpec``, ``make_backend``,
``KVTooLong``, ``check_fits``) and nothing below it; a step reaches a backend as ``step_layout.StepLayout``.

The scheduler asks a backend for a request's cache at admission (``kv_for``; the backend may refuse it) and
gives it back at the request's end (``release``), runs each packed step through ``run`` (the backend builds
its attention metadata from the step's segments) and reads its measured cost curve (draft budgets). It never
sees kernel twins, C++ kernels, thread counts or pool slots.

The backend owns the KV, its contents and its account. Every edit the engine makes of a granted cache is one
of the backend's (``keep`` after a tree forward, ``load_prefix``, ``extend`` over a prefill chunk, and
``prefix_views`` read for the prefix cache: ``edits.KVEdits``, one implementation over ``kv.kvstore``'s
explicit functions); the engine reads a cache's ``length`` and ``capacity`` but writes neither. What a cache
costs is the backend's answer too (``kv_bytes``: a per-request cache its capacity's entries, a pool slot the
whole slot), and admission's byte budget counts that figure, for the caches it is about to ask for and for
those it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ...kv.kvstore import KV, Pieces, RequestKV
from ..kernels import CostCurve, KernelSet
from ..step_layout import PLAN_KWARG

__all__ = ["AUTO", "BACKENDS", "CPU", "GENERIC", "Backend", "BackendSpec", "KVTooLong", "call", "check_fits"]

CPU = "cpu"  # the CPU backend: kernel twins by measurement, C++ kernels, ragged attention, a cache per request
GENERIC = "generic"  # the device-generic backend: torch ops only, one KV pool, one attention call per layer
AUTO = "auto"  # cpu on a CPU model (without exact_numerics), generic elsewhere
BACKENDS = (AUTO, CPU, GENERIC)  # what [generator] backend accepts


@dataclass(frozen=True)
class BackendSpec:
    """What the engine asks of its backend; each backend reads the fields it has a use for."""

    choice: str = AUTO  # one of BACKENDS ([generator] backend)
    threads: int | None = None  # intra-op threads of the engine's step thread (the CPU backend's kernels)
    twins: Any = None  # a caller's kernel twins (``forward.kernels.KernelSet``) shared by engines: CPU backend only
    slots: int = 16  # requests running at once (the generic backend's KV pool slots)
    slot_tokens: int = 2048  # KV entries a request may hold (the generic backend's slot length)
    exact_numerics: bool = False  # bits independent of a forward's width (the generic backend's canonical tiles)
    tile_rows: int = 32  # exact_numerics: rows of every forward
    kv_dtype: str = "auto"  # the CPU backend's request caches: auto, model or float16 (``kv_dtype.KV_DTYPES``)


class KVTooLong(ValueError):
    """A request needs more KV entries than a pool slot holds (the caller's input: INVALID_ARGUMENT)."""


def check_fits(capacity: int, slot_tokens: int | None) -> None:
    """Raise KVTooLong when a request needing ``capacity`` entries can never fit a slot of ``slot_tokens``
    (None: no slot bound)."""
    if slot_tokens is not None and capacity > slot_tokens:
        raise KVTooLong(f"the request needs {capacity} KV entries (prompt + max_new_tokens + one step) but a "
                        f"pool slot holds {slot_tokens}: shorten it or raise [generator] kv_slot_tokens")


class Backend(Protocol):
    """What runs a step's forward and owns the KV it reads."""

    name: str  # CPU or GENERIC
    kernels: KernelSet  # the twins its forwards run through (tests gate them; the engine never reads them)
    widest_tree: int  # draft budget a flat measured cost may widen a request's to (0: the configured width)
    max_capacity: int | None  # most entries ``kv_for`` grants a request (None: no bound but memory)

    @property
    def curve(self) -> CostCurve | None:
        """Seconds per forward by tokens, measured at start-up (None until ``calibrate``)."""

    def calibrate(self, counts: Sequence[int], repeats: int, past: int) -> bool:
        """Measure the cost curve on forwards of ``counts`` tokens over ``past`` entries (once); whether it did."""

    def describe(self) -> str:
        """One line: what runs the forwards (logged at start-up)."""

    def kv_for(self, capacity: int) -> RequestKV:
        """A cache of ``capacity`` entries for a request being admitted (raises when it cannot be had)."""

    def release(self, kv: RequestKV) -> None:
        """A request ended: its cache goes back."""

    def kv_bytes(self, capacity: int) -> int:
        """Bytes a cache of ``capacity`` entries holds from ``kv_for`` to ``release`` (admission's byte budget
        counts it: for a granted cache, ``kv_bytes(kv.capacity)``)."""

    def keep(self, kv: RequestKV, past_len: int, kept: Sequence[int]) -> None:
        """After a tree forward at ``past_len``: keep the entries of tree nodes ``kept`` (ascending); ``length``
        becomes ``past_len + len(kept)``."""

    def load_prefix(self, kv: RequestKV, pieces: Pieces, n: int) -> None:
        """Copy a cached prefix of ``n`` entries (the prefix cache's ``pieces``) into ``kv``; ``length`` n."""

    def extend(self, kv: RequestKV, end: int) -> None:
        """A forward wrote ``kv``'s entries up to ``end`` (a prefill chunk's): ``length`` becomes ``end``."""

    def prefix_views(self, kv: RequestKV, n: int) -> KV:
        """Views of ``kv``'s first ``n`` entries (the prefix cache copies the part it keeps)."""

    def run(self, packed: Any) -> torch.Tensor:
        """The kept rows' logits [K, vocab] of one packed step (``engine.pack.PackedStep``)."""

    def kernel_name(self, tokens: int) -> str:
        """What ran a forward of ``tokens`` tokens (a request's stats record it)."""

    def modules(self) -> Iterable[nn.Module]:
        """The modules its forwards run through (the step profile hooks their heads)."""


def call(runner: nn.Module, ids: Sequence[int], positions: Sequence[int], keep: Sequence[int] | int, plan: object,
         device: torch.device) -> torch.Tensor:
    """One forward of ``ids`` at ``positions`` through ``runner``, its attention metadata ``plan`` passed to every
    layer; the logits of the rows ``keep`` (0: every row): [K, vocab]."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, T]
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=device)  # [1, T]
        kept = keep if isinstance(keep, int) else torch.tensor(list(keep), dtype=torch.long, device=device)  # [K]
        logits = runner(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=kept,
                        **{PLAN_KWARG: plan}).logits  # [1, K, vocab]
    return logits[0]  # [K, vocab]
