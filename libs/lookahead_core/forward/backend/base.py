"""The narrow interface the engine sees of a forward backend (as vLLM's and SGLang's attention backends).

The scheduler asks a backend for a request's cache at admission (``kv_for``; the backend may refuse it) and
gives it back at the request's end (``release``), runs each packed step through ``run`` (the backend builds
its attention metadata from the step's segments) and reads its measured cost curve (draft budgets). It never
sees kernel twins, C++ kernels, thread counts or pool slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from ...kv.kvstore import RequestKV
from ..kernels import CostCurve, KernelSet
from ..ragged import PLAN_KWARG

CPU = "cpu"  # the CPU backend: kernel twins by measurement, C++ kernels, ragged attention, a cache per request
GENERIC = "generic"  # the device-generic backend: torch ops only, one KV pool, one attention call per layer
AUTO = "auto"  # cpu on a CPU model (without exact_numerics), generic elsewhere
BACKENDS = (AUTO, CPU, GENERIC)  # what [generator] backend accepts


class Backend(Protocol):
    """What runs a step's forward and owns the KV it reads."""

    name: str  # CPU or GENERIC
    kernels: KernelSet  # the twins its forwards run through (hooks and the step profile watch them)
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

    def run(self, packed: Any) -> torch.Tensor:
        """The kept rows' logits [K, vocab] of one packed step (``engine.pack.PackedStep``)."""

    def kernel_name(self, tokens: int) -> str:
        """What ran a forward of ``tokens`` tokens (a request's stats record it)."""


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
