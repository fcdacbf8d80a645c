"""The lean layer loop (``forward/lean.py``) over a model on the block kernel.

A one-token forward of SmolLM2 on its Q4_1 blocks moves ~110 MB in ~6 ms, and the Hugging Face modules
around the products cost as much again (a dozen module calls and ~60 small ATen calls a layer). The loop
that runs the fp32 twins' ragged forwards takes the same layers here: q/k/v and gate/up are one product
each (``join``: their codes, scales and offsets concatenated once, each member's layer reading a view of
the joined storage, so nothing is held twice), the steps between products are ``lean_ops``', and the
attention runs by the one width-invariant kernel. ``lean.matches`` checks the loop against the modules'
own forward bit for bit (a prefilled prompt, then one-token steps) before it is offered.

    twin = quant_lean_twin(model)   # None where the layers are not Llama/Qwen2 ones or the bits differ
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..lean import LAYERS, Layer, LeanTwin, _norm, matches
from ..lean_ops import candidates
from .linear import QuantLinear, QuantWeight

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantGroup:
    """Several QuantLinear layers over one input as one product (``FusedGroup.multiply``'s contract)."""

    weights: tuple[QuantWeight, ...]  # one joined weight where the members' formats agree, else one each
    bias: torch.Tensor | None  # [rows] joined, or None where no member has one

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """x W_group^T + b: [..., in] -> [..., rows]."""
        if len(self.weights) == 1:
            return self.weights[0].product(x, self.bias)
        out = torch.cat([w.product(x, None) for w in self.weights], dim=-1)  # [..., rows]
        return out if self.bias is None else out + self.bias


def _joinable(weights: Sequence[QuantWeight]) -> bool:
    first = weights[0]
    return all(w.fmt == first.fmt and w.group == first.group and (w.offsets is None) == (first.offsets is None)
               and w.shape[1] == first.shape[1] and w.tiled == first.tiled for w in weights)


GROUP_ATTR = "lookahead_group"  # the attention's / MLP's joined QuantGroup (q/k/v, gate/up), set by join_layers


def join(owner: nn.Module, members: Sequence[QuantLinear]) -> QuantGroup:
    """One product for ``members`` (same input), kept on ``owner`` (``GROUP_ATTR``): where their formats agree
    their tensors are concatenated once, registered as ``owner``'s buffers (so module copies share them) and
    every member's layer reads views of the joined storage (the same values, held once)."""
    weights = [m.qweight for m in members]
    biases = [m.bias for m in members]
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat([b if b is not None else torch.zeros(m.out_features) for m, b in zip(members, biases,
                                                                                               strict=True)])
    if bias is not None:
        owner.register_buffer("joined_bias", bias, persistent=False)
    if not _joinable(weights):
        group = QuantGroup(tuple(weights), bias)
        setattr(owner, GROUP_ATTR, group)
        return group
    first = weights[0]
    codes = torch.cat([w.codes for w in weights])
    scales = torch.cat([w.scales for w in weights])
    offsets = None if first.offsets is None else torch.cat([w.offsets for w in weights])  # type: ignore[misc]
    joined = QuantWeight(first.fmt, first.group, codes, scales, offsets, "+".join(sorted({w.source for w in weights})),
                         first.tiled)
    for name in ("codes", "scales", "offsets"):
        owner.register_buffer(f"joined_{name}", getattr(joined, name), persistent=False)
    lo = 0
    for member, weight in zip(members, weights, strict=True):
        hi = lo + weight.shape[0]
        member.use(replace(joined.slice_rows(lo, hi), source=weight.source))  # views of the joined storage
        lo = hi
    group = QuantGroup((joined,), bias)
    setattr(owner, GROUP_ATTR, group)
    return group


def _parts(layer: nn.Module) -> tuple[nn.Module, nn.Module, list[QuantLinear], list[QuantLinear]] | None:
    """(attention, MLP, q/k/v, gate/up) of a Llama-shaped layer whose products are all on the block kernel."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)
    names = (type(layer).__name__, type(attn).__name__, type(mlp).__name__, type(norms[0]).__name__)
    if names not in LAYERS or type(norms[1]) is not type(norms[0]):
        return None
    qkv = [getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj")]
    gate_up = [mlp.gate_proj, mlp.up_proj]
    if not all(isinstance(m, QuantLinear) for m in [*qkv, *gate_up, attn.o_proj, mlp.down_proj]):
        return None
    return attn, mlp, qkv, gate_up  # type: ignore[return-value]


def join_layers(model: nn.Module) -> int:
    """Join every Llama-shaped layer's q/k/v and gate/up (``join``), in place; how many layers were joined."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    joined = 0
    for layer in layers:
        parts = _parts(layer)
        if parts is not None:
            attn, mlp, qkv, gate_up = parts
            join(attn, qkv)
            join(mlp, gate_up)
            joined += 1
    return joined


def _layer(index: int, layer: nn.Module) -> Layer | None:
    """``layer``'s parts for the loop, or None where it is not a Llama-shaped layer on the block kernel whose
    groups ``join_layers`` joined."""
    parts = _parts(layer)
    if parts is None:
        return None
    attn, mlp, qkv, gate_up = parts
    groups = getattr(attn, GROUP_ATTR, None), getattr(mlp, GROUP_ATTR, None)
    rotary = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if rotary is None or groups[0] is None or groups[1] is None:
        return None
    return Layer(index, _norm(layer.input_layernorm), groups[0], qkv[0].out_features // attn.head_dim,  # type: ignore[arg-type]
                 attn.o_proj, _norm(layer.post_attention_layernorm), groups[1],  # type: ignore[arg-type]
                 gate_up[0].out_features, mlp.down_proj, mlp.act_fn, float(attn.scaling), rotary)


_offered: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()  # blocks_lean_ok's answers


def blocks_lean_ok(model: nn.Module, modules: Callable[[], nn.Module]) -> bool:
    """Whether the loop runs ``model`` (``quant_lean_twin`` of the module copy ``modules()`` builds; checked once
    per model)."""
    if model not in _offered:
        _offered[model] = quant_lean_twin(modules()) is not None
    return _offered[model]


def quant_lean_twin(twin: nn.Module) -> LeanTwin | None:
    """``twin`` (a model on the block kernel, or its module copy) wrapped in the lean loop, with the first steps
    of ``lean_ops.candidates`` that give its modules' bits; None where its layers cannot be taken or no steps do."""
    body = getattr(twin, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or not isinstance(getattr(twin, "lm_head", None), QuantLinear):
        return None
    taken = [_layer(i, layer) for i, layer in enumerate(layers)]  # type: ignore[arg-type]
    if any(t is None for t in taken):
        return None
    for ops in candidates():
        lean = LeanTwin(twin, taken, ops)  # type: ignore[arg-type]
        if matches(lean):
            log.info("the block-kernel layer loop runs %s with %s steps", type(twin).__name__, ops.name)
            return lean.eval()
    log.warning("the block-kernel layer loop is not offered for %s (its bits differ)", type(twin).__name__)
    return None
