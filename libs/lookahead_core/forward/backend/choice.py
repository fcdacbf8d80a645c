"""The one place a forward backend is chosen: by the model's device and dtype, or forced by config.

    backend = make_backend(model, "auto", GenericConfig(slots=16), kernels=None, threads=2)

"auto": the CPU backend for a CPU model (its twins fall back to the stock kernels where the dtype is not
fp32: ``placement``), the generic one elsewhere (CUDA) or wherever ``exact_numerics`` is asked for.
"""

from __future__ import annotations

from torch import nn

from ..kernels import KernelSet
from .base import AUTO, BACKENDS, CPU, GENERIC, Backend
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


def make_backend(model: nn.Module, choice: str, generic: GenericConfig, kernels: KernelSet | None = None,
                 threads: int | None = None) -> Backend:
    """The backend that runs ``model``'s steps: ``kernels`` (a caller's twins) serve the CPU backend only."""
    device = next(model.parameters()).device
    if backend_name(choice, device.type, generic.exact_numerics) == CPU:
        return CpuBackend(model, kernels, threads)
    return TorchBackend(model, generic)
