"""Fewer, bigger products: one split product per group of Linear layers that read the same input.

Each attention's q/k/v and each MLP's gate/up read one hidden state. ``fuse_weights(model)``
concatenates each group's weights (and biases) once into one storage and makes the model's own
parameters row views into it (``Parameter.data``: the same objects, so every twin already sharing
them reads the joined storage too, and the old storages are freed: no second copy of a weight).
The model's own forward is unchanged (a contiguous row view, the same values).
``fuse_linears(twin)`` then swaps each group's layers in a twin for ``FusedMember`` modules of one
``FusedGroup``: the first member called runs the split product (``split.split_product``) over the
joined rows, the others slice its result, so a layer makes 2 products + o_proj + down_proj instead
of 7. At one row every output row is the same GEMV dot product as the layer's own, so the result is
the stock one bit for bit (``tests/core/test_core_fused.py``); from 2 rows it differs by summation
order only, as the split kernel does. ``fuse_linears(twin, weight_major=True)`` runs each group's product
and every other Linear weight-major instead (``wmajor``: the tree kernel that shares the weights).
``kernels.KernelSet`` measures where each wins.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence

import torch
from torch import nn

from .memory import drop_file_pages
from .split import OneRow, Product, routed, split_linears, split_parts, split_product
from .wmajor import weight_major_linears, weight_major_product

log = logging.getLogger(__name__)

# Attribute names of the Linear layers of one module that read the same input, in call order.
GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def group_linears(module: nn.Module, names: Sequence[str]) -> list[nn.Module] | None:
    """``module``'s layers ``names`` if they can share one product: all present, same input width, all
    biased or none, one dtype and device; else None."""
    layers = [getattr(module, name, None) for name in names]
    if not all(type(m) is nn.Linear for m in layers):
        return None
    first = layers[0].weight  # type: ignore[union-attr]
    same = all(m.in_features == layers[0].in_features  # type: ignore[union-attr]
               and (m.bias is None) == (layers[0].bias is None)  # type: ignore[union-attr]
               and m.weight.dtype == first.dtype and m.weight.device == first.device  # type: ignore[union-attr]
               for m in layers)
    return layers if same else None  # type: ignore[return-value]


def joined(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` are contiguous and lie one after another in one storage (rows of one matrix)."""
    if not all(t.is_contiguous() for t in tensors):
        return False
    base = tensors[0].untyped_storage().data_ptr()
    for a, b in itertools.pairwise(tensors):
        if b.untyped_storage().data_ptr() != base or b.storage_offset() != a.storage_offset() + a.numel():
            return False
    return True


def _join(params: Sequence[nn.Parameter]) -> None:
    """Make ``params`` row views of one new storage holding them in order (no-op when already joined); the
    old values' pages are dropped where they are a mapped file (``memory.drop_file_pages``)."""
    if joined(params):
        return
    old = [(p.data_ptr(), p.numel() * p.element_size()) for p in params]
    whole = torch.cat([p.detach() for p in params])  # [sum of rows, ...]: the one storage
    start = 0
    for p in params:
        p.data = whole[start : start + p.shape[0]]  # the same Parameter object, now a view
        start += p.shape[0]
    drop_file_pages(old)


def fuse_weights(model: nn.Module) -> int:
    """Join every group's weights (and biases) of ``model`` into one storage each, in place; returns the
    groups joined (already joined ones count). The model computes exactly what it did."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            for names in GROUPS:
                layers = group_linears(module, names)
                if layers is None:
                    continue
                _join([m.weight for m in layers])  # type: ignore[misc]
                if layers[0].bias is not None:
                    _join([m.bias for m in layers])  # type: ignore[misc]
                count += 1
    return count


def _whole(first: torch.Tensor, rows: int) -> torch.Tensor:
    """The joined tensor of ``rows`` rows that starts at the view ``first`` ([rows, ...])."""
    return first.as_strided((rows, *first.shape[1:]), first.stride())


class FusedGroup:
    """One product over a group's joined rows, computed once per input and sliced by each member."""

    def __init__(self, layers: Sequence[nn.Module], parts: int, weight_major: bool = False,
                 one_row: OneRow | None = None, many_rows: Product | None = None) -> None:
        self.rows = sum(m.out_features for m in layers)  # type: ignore[misc]
        self.weight = _whole(layers[0].weight, self.rows)  # type: ignore[arg-type]  # [rows, in]
        bias = layers[0].bias
        self.bias = None if bias is None else _whole(bias, self.rows)  # type: ignore[arg-type]  # [rows]
        self.parts = parts  # row blocks of the split product
        self.weight_major = weight_major  # the product as (W x^T)^T instead (``wmajor``): parts unused
        self.one_row = one_row  # the product of a single row (``gemv.gemv_product``); None: split or weight-major
        self.many_rows = many_rows  # the product of several rows (``rows.rows_product``); None: split or weight-major
        self.members = len(layers)
        self._stash = threading.local()  # per thread: (input, output, members still to read it)

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """x W_group^T + b_group by the group's kernel: [..., in] -> [..., rows]."""
        product = routed(x, self.one_row, self.many_rows)
        if product is not None:
            return product(x, self.weight, self.bias)
        if self.weight_major:
            return weight_major_product(x, self.weight, self.bias)
        return split_product(x, self.weight, self.bias, self.parts)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x W_group^T + b_group ([..., in] -> [..., rows]); the same input ``x`` is multiplied once."""
        stash = self._stash
        if getattr(stash, "input", None) is not x:
            stash.output = self.multiply(x)  # [..., rows]
            stash.input, stash.left = x, self.members
        y = stash.output
        stash.left -= 1
        if stash.left == 0:
            stash.input = stash.output = None  # every member has read it: do not hold activations
        return y


class FusedMember(nn.Module):
    """One layer of a ``FusedGroup``: its rows [lo, hi) of the group's product (inference only)."""

    def __init__(self, linear: nn.Module, group: FusedGroup, lo: int) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # shared with the source model: a row view of the joined storage
        self.bias = linear.bias
        self.group = group
        self.lo = lo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.product(x)[..., self.lo : self.lo + self.out_features]  # [..., out]


def _ready(layers: Sequence[nn.Module], parts: int) -> bool:
    """Whether a group's weights (and biases) are joined and its rows divide into ``parts`` blocks."""
    biases = [m.bias for m in layers]
    return (joined([m.weight for m in layers]) and (biases[0] is None or joined(biases))  # type: ignore[misc]
            and sum(m.out_features for m in layers) % parts == 0)  # type: ignore[misc]


def fuse_linears(module: nn.Module, parts: int | None = None, weight_major: bool = False,
                 one_row: OneRow | None = None, many_rows: Product | None = None) -> int:
    """In a twin whose model went through ``fuse_weights``: each joined group whose rows divide into
    ``parts`` becomes ``FusedMember`` modules of one ``FusedGroup``; every other Linear is split
    (``split.split_linears``). ``weight_major``: every product runs weight-major instead (no row blocks,
    so every joined group fuses). ``one_row``: the product of a single row, for every group and split
    layer (the ``gemv`` twin); ``many_rows``: the product of several rows (the ``lean`` twin's rows kernel).
    Returns the groups fused."""
    parts = 1 if weight_major else split_parts() if parts is None else parts
    fused = 0
    for module_ in list(module.modules()):
        for names in GROUPS:
            layers = group_linears(module_, names)
            if layers is None or not _ready(layers, parts):
                continue
            group, lo = FusedGroup(layers, parts, weight_major, one_row, many_rows), 0
            for name, layer in zip(names, layers, strict=True):
                setattr(module_, name, FusedMember(layer, group, lo))
                lo += layer.out_features
            fused += 1
    if weight_major:
        weight_major_linears(module)
        log.info("fused %d layer groups, every product weight-major", fused)
        return fused
    split = split_linears(module, parts, one_row, many_rows)
    log.info("fused %d layer groups, split %d other linear layers into %d row blocks", fused, split, parts)
    return fused
