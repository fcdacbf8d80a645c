"""The shared shape of a twin's Linear kernels: a Linear's own parameters under another product, swapped in.

    class MyLinear(SharedLinear):
        def forward(self, x): ...              # self.weight / self.bias: the source layer's tensors
    swap_linears(twin, MyLinear)              # every nn.Linear under twin, in place
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


class SharedLinear(nn.Module):
    """A Linear layer's parameters under another kernel (inference only): the same tensors, no copy."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # shared with the source model (same tensor, no copy)
        self.bias = linear.bias  # shared too (None: bias-free)


def swap_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace every ``nn.Linear`` under ``module`` by ``make(linear)``, in place; returns how many."""
    linears = [(name, mod) for name, mod in module.named_modules() if type(mod) is nn.Linear]
    for name, mod in linears:
        module.set_submodule(name, make(mod))
    return len(linears)
