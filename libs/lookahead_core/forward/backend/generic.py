"""The device-generic backend: torch ops only, one KV pool per engine, one attention call per layer.

It runs on whatever device the model is on (CUDA, CPU forced for tests, others torch supports) and in any
dtype. Every request's cache is a slot of one preallocated pool (``pool.KVPool``): admission takes a slot or
refuses the request, a step writes and reads the pool in place. A cache costs its whole slot (``kv_bytes``,
whatever its capacity: the slot is held for it); the engine's edits of it are ``edits.KVEdits``'. A step's
forward is the model's own modules (the stock twin) with ``attention.POOLED_ATTENTION``: per layer, one indexed
write of the step's keys and values and one sdpa over every segment.

``exact_numerics``: every forward runs in tiles of exactly ``tile_rows`` rows (the last padded, its padding
writing to the scratch slot), keeps every row's logits, and attends in the canonical layout
(``layout.canonical``): each row reads its keys in position order in a line as long as a slot. A row's
arithmetic is then the same whether it is decoded alone or verified in a tree beside other requests, so
speculation gives the engine's own one-token tokens in half precision too. It costs the padding of
one-token steps to a tile and the gather of each row's line.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ...kv.kvstore import KVShape, RequestKV
from ..kernels import STOCK, CostCurve, KernelSet, measure
from ..step_layout import Segment, StepLayout, causal_visible
from .attention import POOLED_ATTENTION
from .base import GENERIC, call
from .edits import KVEdits
from .layout import canonical, padded
from .pool import KVPool

WIDEST_TREE = 128  # the widest draft budget a flat measured cost widens a request's to

CALIBRATION_WARMUP = 1  # untimed repetitions before the cost curve's timed ones


@dataclass(frozen=True)
class GenericConfig:
    """How the generic backend sizes its pool and shapes its forwards."""

    slots: int = 16  # request slots in the KV pool (the engine's max_running)
    slot_tokens: int = 2048  # KV entries one slot holds: a request's prompt + answer + one step must fit
    key_block: int = 64  # the padded layout's key axis is rounded up to a multiple of this many entries
    exact_numerics: bool = False  # tiles of fixed rows and the canonical attention: bits independent of width
    tile_rows: int = 32  # exact_numerics: rows of every forward (one-token steps are padded to it)

    def __post_init__(self) -> None:
        if min(self.slots, self.slot_tokens, self.key_block, self.tile_rows) < 1:
            raise ValueError("slots, slot_tokens, key_block and tile_rows must be >= 1")
        if self.tile_rows > self.slot_tokens:
            raise ValueError("tile_rows must not exceed slot_tokens (a tile's padding writes into the scratch slot)")


@dataclass
class _Probe:
    """A packed step's fields (``engine.pack.PackedStep``) for a calibration forward."""

    ids: list[int]
    positions: list[int]
    keep: list[int]
    attention: StepLayout = field(default_factory=StepLayout)

    def __len__(self) -> int:
        return len(self.ids)


class TorchBackend(KVEdits):
    """One KV pool and the model's own modules with the pooled attention."""

    name = GENERIC
    widest_tree = WIDEST_TREE  # a launch-bound device verifies wide trees for about a one-token step's time

    def __init__(self, model: nn.Module, config: GenericConfig) -> None:
        self.config = config
        self.shape = KVShape.of(model)
        self.kernels = KernelSet(model, POOLED_ATTENTION, (STOCK,))
        self.pool = KVPool(self.shape, config.slots, config.slot_tokens)
        self._curve: CostCurve | None = None
        self.max_capacity: int | None = config.slot_tokens  # a request's cache is one pool slot

    @property
    def curve(self) -> CostCurve | None:
        return self._curve

    def calibrate(self, counts: Sequence[int], repeats: int, past: int) -> bool:
        if self._curve is not None:
            return False
        past = min(past, self.pool.slot_tokens - max(counts))
        kv = self.pool.take(past + max(counts))  # one slot lent to every probe forward
        try:
            self._curve = measure({self.kernel_name(1): functools.partial(self._probe, kv, past)}, counts, repeats,
                                  CALIBRATION_WARMUP, clock=self._clock)
        finally:
            self.pool.give_back(kv)
        return True

    def describe(self) -> str:
        cfg = self.config
        exact = f", exact numerics in tiles of {cfg.tile_rows} rows" if cfg.exact_numerics else ""
        return (f"generic backend on {self.shape.device} ({self.shape.dtype}): KV pool of {cfg.slots} x "
                f"{cfg.slot_tokens} entries ({self.pool.nbytes / 2**20:.0f} MiB){exact}")

    def kv_for(self, capacity: int) -> RequestKV:
        return self.pool.take(capacity)

    def release(self, kv: RequestKV) -> None:
        self.pool.give_back(kv)

    def kv_bytes(self, capacity: int) -> int:
        return self.pool.slot_bytes  # a request holds a whole slot, however few of its entries it may use

    def run(self, packed: Any) -> torch.Tensor:
        if self.config.exact_numerics:
            return self._tiles(packed)  # [K, vocab]
        step = padded(packed.attention, len(packed), self.pool, self.config.key_block)
        return call(self.kernels.runner(len(packed)), packed.ids, packed.positions, packed.keep, step,
                    self.shape.device)  # [K, vocab]

    def modules(self) -> Iterable[nn.Module]:
        return self.kernels.twins.values()

    def kernel_name(self, tokens: int) -> str:
        return f"{GENERIC}-exact" if self.config.exact_numerics else GENERIC

    def _tiles(self, packed: Any) -> torch.Tensor:
        """``packed`` in tiles of ``tile_rows`` rows, in order (a tree cut by a tile edge reads its earlier rows'
        entries from the pool); every row's logits kept, then the step's own: [K, vocab]."""
        rows, runner, out = self.config.tile_rows, self.kernels.runner(self.config.tile_rows), []
        keep = np.asarray(packed.keep, dtype=np.int64)  # [K], ascending
        for first in range(0, len(packed), rows):
            pad = max(0, first + rows - len(packed))
            ids = [*packed.ids[first : first + rows], *[0] * pad]  # [rows]
            positions = [*packed.positions[first : first + rows], *[0] * pad]  # [rows]
            step = canonical(packed.attention, first, rows, self.pool, self.pool.slot_tokens)
            logits = call(runner, ids, positions, 0, step, self.shape.device)  # [rows, vocab]
            mine = keep[(keep >= first) & (keep < first + rows)] - first  # kept rows in this tile
            out.append(logits[torch.from_numpy(mine).to(logits.device)])  # [k, vocab]
        return torch.cat(out)  # [K, vocab]

    def _probe(self, kv: RequestKV, past: int, n: int) -> None:
        """One forward of ``n`` prompt-like tokens over ``past`` entries of ``kv`` (a lent slot)."""
        plan = StepLayout([Segment(kv, 0, past, causal_visible(n))])
        self.run(_Probe([0] * n, list(range(past, past + n)), list(range(n)), plan))

    def _clock(self) -> float:
        """The wall clock after the device's queued work (a CUDA forward returns before it ends)."""
        if self.shape.device.type == "cuda":
            torch.cuda.synchronize(self.shape.device)
        return time.perf_counter()
