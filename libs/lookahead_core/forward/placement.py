"""Which kernels a model's tensors may reach: the CPU kernels take fp32 tensors on the host, nothing else.

The C++ kernels (``attend.cpp``, ``gemv.cpp``, ``rows_gemm.cpp``/``rows512.cpp``, ``lean_ops.cpp``) read a
tensor's memory as host floats: handed a CUDA tensor they dereference a device pointer (a segfault), handed a
bf16 one they read its bytes as floats where no dtype check stands. The torch-only twins (split, fused,
weight-major, oneDNN, packed) were measured on fp32 CPU only (``EXACT``'s bit-for-bit claims included). So
this module is the one place that says which tensors go there:

- at routing, once: ``cpu_kernels_ok(device, dtype)`` (``kernels.available`` for every twin but stock,
  ``attend.multi_row`` for a forward's attention): a CUDA or half-precision model gets the stock twin and
  sdpa attention only;
- at every kernel entry point, a cheap check of the tensors handed (``check``, two attribute reads a tensor,
  nothing per element): anything else is refused with one line (``PlacementError``), never a segfault.

    cpu_kernels_ok(torch.device("cpu"), torch.float32)   # True
    cpu_kernels_ok("cuda:0", torch.float32)              # False: stock and sdpa
    check("gemv", x, weight, bias)                       # PlacementError on a bf16 or meta tensor
"""

from __future__ import annotations

import torch
from torch import nn

KERNEL_DTYPE = torch.float32  # the one dtype the CPU kernels take
CACHE_DTYPES = (torch.float32, torch.float16)  # what a KV cache the attention and rotary kernels take may hold
KERNEL_DEVICE = "cpu"  # the one device type they take


class PlacementError(TypeError):
    """A CPU kernel was handed a tensor of another device or dtype."""


def cpu_kernels_ok(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether tensors on ``device`` of ``dtype`` may reach the CPU kernels (fp32 on the CPU only)."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    return kind == KERNEL_DEVICE and dtype == KERNEL_DTYPE


def model_placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where ``model``'s weights are and their dtype (its first parameter's)."""
    param = next(model.parameters())
    return param.device, param.dtype


def model_ok(model: nn.Module) -> bool:
    """Whether ``model``'s tensors may reach the CPU kernels (``cpu_kernels_ok`` of its weights)."""
    return cpu_kernels_ok(*model_placement(model))


def refusal(kernel: str, tensor: torch.Tensor) -> PlacementError:
    """The one-line error for ``tensor`` handed to ``kernel``."""
    return PlacementError(f"the {kernel} kernel takes {KERNEL_DTYPE} tensors on the {KERNEL_DEVICE} only, not "
                          f"{tensor.dtype} on {tensor.device} (models of another device or dtype run the stock "
                          "kernels and sdpa)")


def check(kernel: str, *tensors: torch.Tensor | None) -> None:
    """Raise ``PlacementError`` unless every tensor given (None: an absent bias, skipped) is fp32 on the CPU."""
    for t in tensors:
        if t is not None and (t.dtype is not KERNEL_DTYPE or not t.is_cpu):
            raise refusal(kernel, t)


def check_product(kernel: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``check`` of a product's operands, its test spelled out (a forward makes ~4 products a layer)."""
    if (x.dtype is KERNEL_DTYPE and weight.dtype is KERNEL_DTYPE and x.is_cpu and weight.is_cpu
            and (bias is None or (bias.dtype is KERNEL_DTYPE and bias.is_cpu))):
        return
    check(kernel, x, weight, bias)  # raises, naming the first tensor refused


def check_cache(kernel: str, *caches: torch.Tensor) -> None:
    """Raise ``PlacementError`` unless every KV buffer given is on the CPU and fp32 or half (``CACHE_DTYPES``)."""
    for t in caches:
        if t.dtype not in CACHE_DTYPES or not t.is_cpu:
            raise PlacementError(f"the {kernel} kernel takes a KV cache of {' or '.join(map(str, CACHE_DTYPES))} on "
                                 f"the {KERNEL_DEVICE} only, not {t.dtype} on {t.device}")


def check_on_cpu(kernel: str, *tensors: torch.Tensor) -> None:
    """Raise ``PlacementError`` unless every tensor given is on the CPU (masks: any dtype the kernel checks)."""
    for t in tensors:
        if not t.is_cpu:
            raise refusal(kernel, t)
