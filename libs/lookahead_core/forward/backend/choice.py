"""The one place a forward backend is chosen: by the model's device and dtype, or forced by config.

    backend = make_backend(model, BackendSpec(choice="auto", threads=2, slots=16))

"auto": the CPU backend for a CPU model (its twins fall back to the stock kernels where the dtype is not
fp32: ``placement``), the generic one elsewhere (CUDA) or wherever ``exact_numerics`` is asked for.
"""

from __future__ import annotations

from torch import nn

from ..support import check_supported
from .base import AUTO, BACKENDS, CPU, GENERIC, Backend, BackendSpec
from .cpu import CpuBackend
from .generic import GenericConfig, TorchBackend


def backend_name(choice: str, device_type: str, exact_numerics: bool) -> str:
    """Which backend ``choice`` means for a model on ``device_type``. Examples: ("auto", "cpu", False) -> "cpu";
    ("auto", "cuda", False) -> "generic"; ("auto", "cpu", True) -> "generic"; ("cpu", "cuda", False) -> error."""
    if choice not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {choice!r}")
    if choice == CPU and device_type != "cpu":
        raise ValueError(f"the cpu backend runs CPU models only (this model is on {device_type})")
    if choice == CPU and exact_numerics:
        raise ValueError("exact_numerics runs on the generic backend (backend = \"generic\" or \"auto\")")
    if choice == AUTO:
        return CPU if device_type == "cpu" and not exact_numerics else GENERIC
    return choice


def make_backend(model: nn.Module, spec: BackendSpec) -> Backend:
    """The backend that runs ``model``'s steps (a model whose attention the tree mask would get wrong is refused:
    ``support.check_supported``)."""
    check_supported(model)
    device = next(model.parameters()).device
    if backend_name(spec.choice, device.type, spec.exact_numerics) == CPU:
        return CpuBackend(model, spec.twins, spec.threads, spec.kv_dtype)
    return TorchBackend(model, GenericConfig(slots=spec.slots, slot_tokens=spec.slot_tokens,
                                             exact_numerics=spec.exact_numerics, tile_rows=spec.tile_rows))
