"""The floor of a forward: the bytes it must read from memory, and how fast this machine reads them.

A decode step multiplies every weight by a few rows, so on a CPU it is memory-bound: it cannot take
less than (weights + the KV it attends over) / read bandwidth. ``read_bandwidth`` measures that
bandwidth the way a forward reads, with the calling thread's intra-op threads: a ``sum`` over a
buffer far larger than every cache (on the shared 2-core boxes it moved between 26 and 52 GB/s from
minute to minute, so measure it in the same run as the figure compared with it). The engine measures
it once when it calibrates its kernels (``shared.calibrate_once``); ``latest()`` gives that figure
to the step profile (``engine/profile.py``).

    floor = floor_seconds(weight_bytes(model) + kv_entries * kv_bytes_per_entry(model), read_bandwidth())
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from .quant.linear import QuantEmbedding, QuantLinear

BANDWIDTH_BYTES = 512 << 20  # buffer summed to measure read bandwidth (far beyond every CPU cache)
BANDWIDTH_REPEATS = 5  # sums timed; the fastest is kept (other work on a shared box only ever slows it)
_LOCK = threading.Lock()
_LATEST: list[Bandwidth] = []  # the process's last measurement (one entry at most)


@dataclass(frozen=True)
class Bandwidth:
    """A measured read bandwidth."""

    bytes_per_s: float  # fastest sum over the buffer: bytes / seconds
    threads: int  # intra-op threads it was measured with
    measured_at: float  # time.time() of the measurement

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def read_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = BANDWIDTH_REPEATS) -> Bandwidth:
    """Read bandwidth of this thread's intra-op threads: the fastest of ``repeats`` sums over ``nbytes``
    of fp32 (the first touch, which faults the pages in, is not timed). Kept as ``latest()``."""
    if nbytes < 4 or repeats < 1:
        raise ValueError("need nbytes >= 4 and repeats >= 1")
    buf = torch.ones(nbytes // 4, dtype=torch.float32)  # [nbytes / 4]: written once, so every page is resident
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - t0)
    measured = Bandwidth(buf.numel() * 4 / best, torch.get_num_threads(), time.time())
    with _LOCK:
        _LATEST[:] = [measured]
    return measured


def latest() -> Bandwidth | None:
    """The process's last ``read_bandwidth`` measurement (None before the first)."""
    with _LOCK:
        return _LATEST[0] if _LATEST else None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights a forward reads: every parameter and buffer's storage once (shared and joined storages
    once: a quantized model's layers read views of their group's), except an input embedding that is not also
    the output head (a forward reads only its rows for the input ids)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = _storages(embed) - _storages(head) if embed is not None else set()
    seen: dict[int, int] = {}
    for t in _weights(model):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _weights(module: nn.Module) -> list[torch.Tensor]:
    """``module``'s parameters, and the block kernel's codes, scales and offsets (buffers of its layers)."""
    blocks = [b for m in module.modules() if isinstance(m, QuantLinear | QuantEmbedding) for b in m.buffers()]
    return [*module.parameters(), *blocks]


def _storages(module: nn.Module | None) -> set[int]:
    """The storages ``module``'s weights live in."""
    return set() if module is None else {t.untyped_storage().data_ptr() for t in _weights(module)}


def kv_bytes_per_entry(model: nn.Module) -> int:
    """Bytes of K and V of one cached token over every layer (what attention reads per entry)."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element


def floor_seconds(nbytes: float, bandwidth: Bandwidth) -> float:
    """The least time reading ``nbytes`` can take at ``bandwidth``."""
    return nbytes / bandwidth.bytes_per_s
