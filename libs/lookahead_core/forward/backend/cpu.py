"""The CPU backend: today's kernel twins (measured per forward size), C++ kernels and ragged attention.

Each request has a cache of its own (``kvstore.RequestKV``, sized at admission); a step's forward runs through
the twin measured fastest at its size, and its attention writes each segment's entries into its request's
cache and attends by ``attend.multi_row``'s kernel or sdpa (``ragged.ragged_attention``). A cache costs its
capacity's entries (``kv_bytes``), each in half where every forward reads the cache through the attention
kernel (``kv_dtype``: a model on the block kernel); the engine's edits of it are ``edits.KVEdits``'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...kv.kvstore import KVShape, RequestKV
from ..kernels import CostCurve, KernelSet
from ..probe import RaggedProbe
from ..ragged import RAGGED_ATTENTION, RaggedPlan
from ..shared import calibrate_once
from .base import CPU, call
from .edits import KVEdits
from .kv_dtype import AUTO, cache_dtype


class CpuBackend(KVEdits):
    """Kernel twins by measurement over per-request caches."""

    name = CPU
    widest_tree = 0  # the configured draft budgets: tuned on CPUs, where every row costs
    max_capacity = None  # a request's cache is its own tensor, sized at admission

    def __init__(self, model: nn.Module, kernels: KernelSet | None = None, threads: int | None = None,
                 kv_dtype: str = AUTO) -> None:
        self.kernels = kernels or KernelSet(model, RAGGED_ATTENTION, threads=threads)
        stock = KVShape.of(model)
        self.dtype = stock.dtype  # the model's: its queries and sdpa's masks
        self.shape = replace(stock, dtype=cache_dtype(model, kv_dtype))  # its request caches (half where it can be)

    @property
    def curve(self) -> CostCurve | None:
        return self.kernels.curve

    def calibrate(self, counts: Sequence[int], repeats: int, past: int) -> bool:
        return calibrate_once(self.kernels, RaggedProbe(self.shape, past, self.dtype), counts, repeats)

    def describe(self) -> str:
        return f"cpu backend, {self.shape.dtype} KV, kernels by forward size: {self.kernels.describe()}"

    def kv_for(self, capacity: int) -> RequestKV:
        return RequestKV(self.shape, capacity)

    def release(self, kv: RequestKV) -> None:
        """Nothing to give back: the cache is freed with the request."""

    def kv_bytes(self, capacity: int) -> int:
        return capacity * self.shape.bytes_per_token  # the request's own buffers, sized at admission

    def run(self, packed: Any) -> torch.Tensor:
        layout = packed.attention
        plan = RaggedPlan.of(layout, self.dtype, self.shape.device)  # sdpa's masks, the kernel's visibility
        logits = call(self.kernels.runner(len(packed)), packed.ids, packed.positions, packed.keep, plan,
                      self.shape.device)  # [K, vocab]
        layout.attention_s += plan.attention_s
        return logits

    def modules(self) -> Iterable[nn.Module]:
        return self.kernels.twins.values()

    def kernel_name(self, tokens: int) -> str:
        curve, names = self.kernels.curve, self.kernels.names
        return curve.best(tokens) if curve is not None and len(names) > 1 else names[0]
