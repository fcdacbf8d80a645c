"""The forward as one lean layer loop: the model's own operations without the module plumbing.

With the exact GEMV (``gemv.py``) a SmolLM2 one-token forward moves its weights in ~15 ms on a 2-core
EPYC, and spent ~6 ms more around them: ~60 small ATen calls a layer and, mostly, the Python that makes
them (a dozen ``nn.Module`` calls a layer, the kwargs, mask and output plumbing of the HF model, the
ragged attention's per-segment loop, the fused members' stash); a tree forward pays the same. ``LeanTwin``
wraps a fused twin (one-row products by the GEMV, several rows by the rows kernel) and runs every ragged
forward itself, as gpt-fast's ``generate.py`` does: one loop over the layers, each request's own cache, and
the operations the model's code makes, on the same tensors in the same order (the norm's formula, the
modeling module's rotary function and activation, sdpa over each request's entries with its segment's
mask, the group products), the small ones fused where that keeps their arithmetic (``lean_ops``). So the
logits are the wrapped twin's bit for bit: at one token, plain greedy's. A call without a ragged plan goes
to the wrapped twin unchanged.

Only decoder layers of the Llama shape are taken (``LAYERS``: Llama and Qwen2, whose code the loop
follows; any other model keeps the twin it had), and nothing is assumed: ``matches`` prefills a random
prompt and runs a short greedy decoding through both paths, and the loop is offered only where every
logit and every cache entry is the same bit for bit (``kernels.available``, once per model).
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep

from ..kv.kvstore import KVShape, RequestKV
from .attend import attend_segments, invariant_rows, multi_row
from .fused import FusedGroup, FusedMember
from .lean_ops import Ops, Rotary, candidates
from .ragged import INVARIANT_ATTR, RaggedPlan
from .split import SplitLinear
from .step_layout import PLAN_KWARG, Segment, causal_visible

log = logging.getLogger(__name__)

# The decoder layers whose forward the loop follows, by class name: (layer, attention, MLP, RMSNorm).
LAYERS = frozenset({
    ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    ("Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
})
CHECK_SEED = 0  # the random prompt ``matches`` decodes from
CHECK_PROMPT = 12  # its tokens, prefilled by the twin
CHECK_STEPS = 4  # one-token forwards compared after it

_checked: weakref.WeakKeyDictionary[nn.Module, dict[str, Ops | None]] = weakref.WeakKeyDictionary()  # lean_ops


@dataclass(frozen=True)
class Norm:
    """An RMSNorm's weight and epsilon."""

    weight: torch.Tensor  # [hidden]
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The Llama/Qwen2 RMSNorm's arithmetic, op for op (its ``.to`` calls are no-ops in fp32)."""
        variance = x.pow(2).mean(-1, keepdim=True)  # [1, T, 1]
        return self.weight * (x * torch.rsqrt(variance + self.eps))  # [1, T, hidden]


@dataclass(frozen=True)
class Layer:
    """What the loop reads of one decoder layer."""

    index: int  # the layer's index in the request's KV
    before: Norm  # input_layernorm
    qkv: FusedGroup  # q/k/v as one product
    heads: int  # attention heads (q's columns of the group's product: heads * head_dim)
    o: SplitLinear
    after: Norm  # post_attention_layernorm
    gate_up: FusedGroup  # gate/up as one product
    inter: int  # intermediate size: gate's columns of the group's product
    down: SplitLinear
    act: Callable[[torch.Tensor], torch.Tensor]  # the MLP's own activation module
    scaling: float  # the attention's score scale
    rotary: Rotary


def _norm(module: nn.Module) -> Norm:
    return Norm(module.weight, float(module.variance_epsilon))  # type: ignore[arg-type]


def _lean_layer(index: int, layer: nn.Module) -> Layer | None:
    """``layer``'s parts for the loop, or None where it is not a Llama-shaped layer of a fused twin with a
    one-row product."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)
    names = (type(layer).__name__, type(attn).__name__, type(mlp).__name__, type(norms[0]).__name__)
    if names not in LAYERS or type(norms[1]) is not type(norms[0]):
        return None
    members = [getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj")] + [mlp.gate_proj, mlp.up_proj]
    singles = [attn.o_proj, mlp.down_proj]
    if not all(isinstance(m, FusedMember) for m in members) or not all(isinstance(m, SplitLinear) for m in singles):
        return None
    q, k, _v, gate, _up = members
    if q.group is not k.group or gate.group is not _up.group or q.lo != 0 or gate.lo != 0:
        return None
    if q.group.one_row is None or any(m.one_row is None for m in singles):  # type: ignore[union-attr]
        return None
    rotary = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if rotary is None:
        return None
    return Layer(index, _norm(norms[0]), q.group, q.out_features // attn.head_dim, attn.o_proj, _norm(norms[1]),
                 gate.group, gate.out_features, mlp.down_proj, mlp.act_fn, float(attn.scaling), rotary)


def lean_layers(twin: nn.Module) -> list[Layer] | None:
    """Every decoder layer of ``twin`` (fused, with a one-row product) for the loop, or None where one cannot be
    taken."""
    body = getattr(twin, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or not all(hasattr(body, n) for n in ("embed_tokens", "norm", "rotary_emb")):
        return None
    if not isinstance(getattr(twin, "lm_head", None), SplitLinear) or type(body.norm).__name__ not in {  # type: ignore[union-attr]
            names[3] for names in LAYERS}:
        return None
    taken = [_lean_layer(i, layer) for i, layer in enumerate(layers)]  # type: ignore[arg-type]
    return None if any(t is None for t in taken) else taken  # type: ignore[return-value]


class LeanTwin(nn.Module):
    """A twin whose ragged forwards run as one layer loop over its modules (``lean_layers``), its steps between
    products made by ``ops`` (``lean_ops``)."""

    def __init__(self, twin: nn.Module, layers: list[Layer], ops: Ops) -> None:
        super().__init__()
        self.twin = twin  # every other forward, and the parameters (shared with the model)
        self.layers = layers
        self.ops = ops
        body = twin.model
        self.embed, self.rotary_emb = body.embed_tokens, body.rotary_emb
        self.norms = [layer.before for layer in layers[1:]] + [_norm(body.norm)]  # the norm after each layer
        self.lm_head = twin.lm_head  # called as a module: a step profile's hooks time it
        cfg = twin.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    @classmethod
    def of(cls, twin: nn.Module, ops: Ops) -> LeanTwin:
        """``twin`` (fused, with a one-row product) wrapped; ValueError where ``lean_layers`` cannot take its layers."""
        layers = lean_layers(twin)
        if layers is None:
            raise ValueError("the lean loop takes Llama/Qwen2 decoder layers of a gemv twin only")
        return cls(twin, layers, ops)

    @property
    def config(self) -> Any:
        return self.twin.config

    def get_input_embeddings(self) -> nn.Module:
        return self.twin.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.twin.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, **kwargs: Any) -> Any:
        plan = kwargs.get(PLAN_KWARG)
        if not isinstance(plan, RaggedPlan) or input_ids is None or position_ids is None or kwargs.get("use_cache"):
            return self.twin(input_ids=input_ids, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        return CausalLMOutputWithPast(logits=self.step(input_ids, position_ids, logits_to_keep, plan))

    def step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, logits_to_keep: int | torch.Tensor,
             plan: RaggedPlan) -> torch.Tensor:
        """The kept rows' logits ([1, K, vocab]) of the packed row ``input_ids`` ([1, T]), every request's
        keys and values written into its cache.

        Each residual add is made with the norm that follows it (the next layer's input norm, the final
        norm last): x is the residual stream, h its normed copy, both [1, T, hidden]."""
        add_norm = self.ops.add_norm
        x, h = add_norm(self.embed(input_ids), None, self.layers[0].before)
        cos, sin = self.rotary_emb(x, position_ids)  # [1, T, head_dim] each
        for layer, then in zip(self.layers, self.norms, strict=True):
            x, h = add_norm(x, layer.o(self._attend(layer, h, cos, sin, plan)), layer.after)
            gate_up = layer.gate_up.multiply(h)  # [1, T, 2 * inter]
            x, h = add_norm(x, layer.down(layer.act(gate_up[..., : layer.inter]) * gate_up[..., layer.inter :]), then)
        return self.lm_head(slice_logits_to_keep(h, logits_to_keep))  # [1, K, vocab]

    def _attend(self, layer: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                plan: RaggedPlan) -> torch.Tensor:
        """One layer's attention output for the normed rows ``h`` ([1, T, hidden] -> [1, T, heads * head_dim]):
        each request's rows attend to its own cache with its segment's mask, as ``ragged_attention`` does. A
        forward of several rows runs every segment by the attention kernel in one call (``attend.multi_row``),
        a one-token forward by sdpa (plain greedy's bits)."""
        qkv = layer.qkv.multiply(h)  # [1, T, (heads + 2 kv_heads) * head_dim]
        started = time.perf_counter() if plan.timed else 0.0
        if getattr(self.config, INVARIANT_ATTR, ""):  # on the block kernel: one kernel for every forward
            fast = invariant_rows(self.head_dim, h.device, h.dtype)
        else:
            fast = multi_row(self.head_dim, h.device, h.dtype) if h.shape[1] > 1 else None
        if fast is None:
            out = self._sdpa(layer, h, qkv, cos, sin, plan)
        else:
            out = h.new_empty(1, h.shape[1], layer.heads * self.head_dim)  # [1, T, heads * head_dim]
            spans = [slice(seg.start, seg.start + seg.q) for seg in plan.segments]
            qs = [self.ops.rotate_and_cache(qkv[:, rows], cos[:, rows], sin[:, rows], seg.kv, layer.index, seg.past,
                                            layer.heads, self.head_dim, layer.rotary).contiguous()
                  for seg, rows in zip(plan.segments, spans, strict=True)]  # each [1, heads, q, head_dim]
            kvs = [seg.kv for seg in plan.segments]
            attend_segments(fast, qs, [kv.keys[layer.index] for kv in kvs], [kv.values[layer.index] for kv in kvs],
                            [seg.past for seg in plan.segments], plan.visible, layer.scaling,
                            [out[0, rows] for rows in spans])  # each [q, heads * head_dim]
        if plan.timed:
            plan.attention_s += time.perf_counter() - started
        return out

    def _sdpa(self, layer: Layer, h: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              plan: RaggedPlan) -> torch.Tensor:
        """``_attend``'s output by sdpa, segment by segment (a one-token forward: plain greedy's bits)."""
        whole = len(plan.segments) == 1
        out = None if whole else h.new_empty(1, h.shape[1], layer.heads * self.head_dim)  # [1, T, heads * head_dim]
        for seg, mask in zip(plan.segments, plan.masks, strict=True):
            end = seg.start + seg.q
            rows = slice(None) if whole else slice(seg.start, end)
            q = self.ops.rotate_and_cache(qkv[:, rows], cos[:, rows], sin[:, rows], seg.kv, layer.index, seg.past,
                                          layer.heads, self.head_dim, layer.rotary)  # [1, heads, q, head_dim]
            keys, values = seg.kv.view(layer.index, seg.past + seg.q)  # [1, kv_heads, past + q, head_dim] each
            seen = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.scaling,
                                                  enable_gqa=q.shape[1] != keys.shape[1])  # [1, heads, q, head_dim]
            seen = seen.transpose(1, 2).reshape(1, seg.q, -1)  # [1, q, heads * head_dim]
            if out is None:
                out = seen
            else:
                out[:, seg.start : end] = seen
        return out  # type: ignore[return-value]


def _forward(runner: nn.Module, kv: RequestKV, ids: list[int]) -> torch.Tensor:
    """Logits of ``ids`` appended to ``kv`` through ``runner`` (one causal segment): [1, len(ids), vocab]."""
    past, n = kv.length, len(ids)
    plan = RaggedPlan([Segment(kv, 0, past, causal_visible(n))])
    plan.finalize(kv.shape.dtype, kv.shape.device)
    with torch.inference_mode():
        logits = runner(input_ids=torch.tensor([ids]), position_ids=torch.arange(past, past + n)[None],
                        use_cache=False, logits_to_keep=torch.arange(n), **{PLAN_KWARG: plan}).logits
    kv.length = past + n
    return logits


def matches(lean: LeanTwin) -> bool:
    """Whether the loop gives the wrapped twin's bits: a random prompt prefilled, then ``CHECK_STEPS``
    greedy one-token forwards, through each path on its own cache; every logit and every cache entry must
    be equal."""
    shape = KVShape.of(lean)
    gen = torch.Generator().manual_seed(CHECK_SEED)
    prompt = torch.randint(lean.config.vocab_size, (CHECK_PROMPT,), generator=gen).tolist()
    caches = [RequestKV(shape, CHECK_PROMPT + CHECK_STEPS) for _ in range(2)]
    want, got = _forward(lean.twin, caches[0], prompt), _forward(lean, caches[1], prompt)
    if not torch.equal(want, got):  # a prefill chunk: several rows, a causal mask
        return False
    token = int(want[0, -1].argmax())
    for _ in range(CHECK_STEPS):
        want, got = _forward(lean.twin, caches[0], [token]), _forward(lean, caches[1], [token])
        if not torch.equal(want, got):
            return False
        token = int(want[0, -1].argmax())
    n = caches[0].length
    return all(torch.equal(a[:, :, :n], b[:, :, :n]) for a, b in zip(
        caches[0].keys + caches[0].values, caches[1].keys + caches[1].values, strict=True))


def lean_ops(model: nn.Module, modules: Callable[[], nn.Module], kernel: str) -> Ops | None:
    """The steps the loop runs ``model`` with under ``kernel`` (its products): the first of
    ``lean_ops.candidates`` for which ``matches`` holds on the twin ``modules()`` builds; None where none
    does or the loop does not take its layers (checked once per model and kernel)."""
    answers = _checked.setdefault(model, {})
    if kernel not in answers:
        twin = modules()
        found = None
        if lean_layers(twin) is not None:
            found = next((ops for ops in candidates() if matches(LeanTwin.of(twin, ops))), None)
        answers[kernel] = found
        if found is None:
            log.warning("the %s layer loop is not offered for this model (%s)", kernel, type(model).__name__)
        else:
            log.info("the %s layer loop runs %s with %s steps", kernel, type(model).__name__, found.name)
    return answers[kernel]


def lean_ok(model: nn.Module, modules: Callable[[], nn.Module], kernel: str) -> bool:
    """Whether the loop is offered for ``model`` under ``kernel`` (``lean_ops`` found steps giving the twin's bits)."""
    return lean_ops(model, modules, kernel) is not None
