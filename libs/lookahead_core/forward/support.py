"""Which models the tree mask is right for: full causal attention on every layer, sdpa or eager.

Tree verification hands every layer one additive mask (tree ancestors + the whole past). Layers
that see less than the whole past (sliding windows, chunks), that carry a recurrent state instead
of keys and values (mamba, linear attention), that reshape the scores (logit soft-capping), or an
attention kernel that may ignore a float mask would all break exact greedy equality, so such
models are refused up front with one clear line.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PretrainedConfig, PreTrainedModel

from .ragged import RAGGED_ATTENTION

FULL_KINDS = frozenset({"full_attention", "attention"})  # layer kinds (layer_types / layers_block_type) we support
# Layer kinds that attend to a window or chunk of the past only.
WINDOW_KINDS = frozenset(
    {"sliding_attention", "chunked_attention", "window_attention", "hybrid_sliding", "reference_sliding_attention"}
)
WINDOW_ATTRS = ("sliding_window", "attention_chunk_size")  # config fields that window every layer if no layer_types
# Attention implementations the model may come with (the engine's twins run RAGGED_ATTENTION, built on sdpa).
SUPPORTED_ATTN = frozenset({"sdpa", "eager", RAGGED_ATTENTION})
# Rotary scalings that depend on the longest sequence in the forward: in a packed row one request's
# length would change every other request's rotary embedding.
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


class UnsupportedModelError(ValueError):
    """The model's attention is one the tree mask would get wrong."""


def _layer_kinds(config: PretrainedConfig) -> list[str]:
    """Every per-layer kind the config declares (both transformers conventions)."""
    kinds: list[str] = []
    for attr in ("layer_types", "layers_block_type"):
        value = getattr(config, attr, None)
        if isinstance(value, Sequence) and not isinstance(value, str):
            kinds.extend(str(k) for k in value)
    return kinds


def _rope_types(config: PretrainedConfig) -> list[str]:
    """Every rotary scaling type the config declares: ``rope_parameters`` (one dict, or one per layer
    type) and the older ``rope_scaling``."""
    found: list[str] = []
    for attr in ("rope_parameters", "rope_scaling"):
        value = getattr(config, attr, None)
        if not isinstance(value, dict):
            continue
        for params in [value, *(v for v in value.values() if isinstance(v, dict))]:
            kind = params.get("rope_type", params.get("type"))
            if isinstance(kind, str):
                found.append(kind)
    return found


def unsupported_reasons(config: PretrainedConfig) -> list[str]:
    """Why the tree mask would be wrong for a model with this config ([] = supported)."""
    config = config.get_text_config(decoder=True)
    reasons: list[str] = []
    kinds = _layer_kinds(config)
    windowed = sorted({k for k in kinds if k in WINDOW_KINDS})
    if windowed:
        reasons.append(f"sliding-window/chunked attention layers ({', '.join(windowed)})")
    elif getattr(config, "layer_types", None) is None:  # no per-layer kinds: a window set applies to every layer
        for attr in WINDOW_ATTRS:
            value = getattr(config, attr, None)
            if value is not None:
                reasons.append(f"sliding-window/chunked attention ({attr}={value})")
    other = sorted({k for k in kinds if k not in FULL_KINDS | WINDOW_KINDS})
    if other:
        reasons.append(f"hybrid or non-attention layers ({', '.join(other)})")
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        reasons.append(f"attention logit soft-capping (attn_logit_softcapping={softcap})")
    dynamic = sorted({k for k in _rope_types(config) if k in LENGTH_DEPENDENT_ROPE})
    if dynamic:
        reasons.append(f"length-dependent rotary scaling (rope_type {', '.join(dynamic)}: one request's length "
                       "would change the others' positions in a shared forward)")
    attn = getattr(config, "_attn_implementation", None)
    if attn is not None and attn not in SUPPORTED_ATTN:
        reasons.append(f"attention implementation {attn!r} (supported: {', '.join(sorted(SUPPORTED_ATTN))})")
    return reasons


def check_supported(model: PreTrainedModel) -> None:
    """Raise UnsupportedModelError (one line naming every reason) unless the tree mask is exact for ``model``."""
    reasons = unsupported_reasons(model.config)
    if reasons:
        kind = getattr(model.config, "model_type", "") or type(model).__name__
        raise UnsupportedModelError(
            f"lookahead decoding does not support this {kind} model: {'; '.join(reasons)}"
            " (tree verification needs full causal attention on every layer)"
        )
