"""The shared shape of a twin's Linear kernels: a Linear's own parameters under another product, swapped in.

    class MyLinear(SharedLinear):
        def forward(self, x): ...              # self.weight / self.bias: the source layer's tensors
    swap_linears(twin, MyLinear)              # every nn.Linear under twin, in place
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

log = logging.getLogger(__name__)


class SharedLinear(nn.Module):
    """A Linear layer's parameters under another kernel (inference only): the same tensors, no copy."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # shared with the source model (same tensor, no copy)
        self.bias = linear.bias  # shared too (None: bias-free)


def swap_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module], kernel: str = "") -> int:
    """Replace every ``nn.Linear`` under ``module`` by ``make(linear)``, in place; returns how many
    (logged as run by ``kernel`` when it is named)."""
    linears = [(name, mod) for name, mod in module.named_modules() if type(mod) is nn.Linear]
    for name, mod in linears:
        module.set_submodule(name, make(mod))
    if kernel:
        log.info("%d linear layers run %s", len(linears), kernel)
    return len(linears)
