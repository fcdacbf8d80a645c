"""check_supported: models whose attention the tree mask would get wrong are refused with one clear line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from lookahead_core.forward.support import UnsupportedModelError, check_supported, unsupported_reasons
from lookahead_core.models import load_model
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    JambaConfig,
    Llama4TextConfig,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from tests.core.helpers import StubTokenizer, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 2  # layers of every tiny config
# sizes shared by the tiny attention configs (built from config, never trained)
TINY = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}


def with_attn(config: PretrainedConfig, attn: str) -> PretrainedConfig:
    """The config with its attention implementation set (as a loaded model's config has it)."""
    config._attn_implementation = attn
    return config


# name -> (config builder, words the reason must contain)
REFUSED: dict[str, tuple[Callable[[], PretrainedConfig], tuple[str, ...]]] = {
    # mistral: sliding_window set, no per-layer kinds -> every layer is windowed
    "mistral": (lambda: MistralConfig(**TINY), ("sliding-window", "sliding_window=4096")),
    # qwen2 with use_sliding_window and every layer past max_window_layers -> sliding layers
    "qwen2-sliding": (
        lambda: Qwen2Config(**TINY, use_sliding_window=True, max_window_layers=0),
        ("sliding-window", "sliding_attention"),
    ),
    # gemma2: alternating sliding layers and attention logit soft-capping: both named
    "gemma2": (lambda: Gemma2Config(**TINY, head_dim=8), ("sliding_attention", "soft-capping", "50.0")),
    # soft-capping alone (full attention on every layer)
    "softcap-only": (
        lambda: Gemma2Config(**TINY, head_dim=8, layer_types=["full_attention"] * LAYERS),
        ("soft-capping",),
    ),
    # llama4 text: chunked attention layers
    "llama4-chunked": (lambda: Llama4TextConfig(**TINY, num_local_experts=2), ("chunked_attention",)),
    # jamba: mamba layers beside attention (hybrid)
    "jamba": (lambda: JambaConfig(**TINY, attn_layer_period=2, attn_layer_offset=1), ("hybrid", "mamba")),
    # mamba: no attention at all
    "mamba": (lambda: MambaConfig(hidden_size=16, num_hidden_layers=LAYERS, vocab_size=64), ("linear_attention",)),
    # a layer_types entry we do not know is refused, not assumed to be full attention
    "unknown-kind": (lambda: LlamaConfig(**TINY, layer_types=["full_attention", "conv"]), ("conv",)),
    # flash attention (may ignore or reject a float tree mask)
    "flash-attention": (lambda: with_attn(LlamaConfig(**TINY), "flash_attention_2"), ("'flash_attention_2'",)),
    # flex attention
    "flex-attention": (lambda: with_attn(LlamaConfig(**TINY), "flex_attention"), ("'flex_attention'",)),
    # dynamic NTK rope: scaled by the longest sequence in the forward, so one request would move another's
    "dynamic-rope": (lambda: LlamaConfig(**TINY, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                     ("rotary", "dynamic")),
    # longrope: short or long factors by the forward's length
    "longrope": (lambda: LlamaConfig(**TINY, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 64}), ("rotary", "longrope")),
}

ACCEPTED: dict[str, Callable[[], PretrainedConfig]] = {
    # plain llama, attention not chosen yet (transformers picks sdpa or eager)
    "llama": lambda: LlamaConfig(**TINY),
    # qwen2 defaults: use_sliding_window False
    "qwen2": lambda: Qwen2Config(**TINY),
    # qwen2 sliding window switched on but no layer reaches max_window_layers: no sliding layer
    "qwen2-window-unused": lambda: Qwen2Config(**TINY, use_sliding_window=True, max_window_layers=LAYERS),
    # the stock implementations the tree mask works with
    "llama-sdpa": lambda: with_attn(LlamaConfig(**TINY), "sdpa"),
    "llama-eager": lambda: with_attn(LlamaConfig(**TINY), "eager"),
    # our own registered implementations
    "llama-ragged": lambda: with_attn(LlamaConfig(**TINY), RAGGED_ATTENTION),
    # a fixed rotary scaling (linear) is the same for every request: fine in a shared forward
    "linear-rope": lambda: LlamaConfig(**TINY, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_configs_name_the_reason(name: str) -> None:
    build, words = REFUSED[name]
    reasons = "; ".join(unsupported_reasons(build()))
    for word in words:
        assert word in reasons, (name, reasons)


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_accepted_configs(name: str) -> None:
    assert unsupported_reasons(ACCEPTED[name]()) == []


def tiny(config: PretrainedConfig) -> PreTrainedModel:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_check_supported_raises_one_line_value_error() -> None:
    # a real tiny mistral: a ValueError subclass, one line, naming the model type and the reason
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(tiny(MistralConfig(**TINY)))
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert "\n" not in message
    assert "mistral" in message and "sliding_window=4096" in message


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_check_supported_passes_real_tiny_models(family: str) -> None:
    # the tiny models every decoder test uses (sdpa) pass without an error
    model = tiny_model(family)
    check_supported(model)
    assert unsupported_reasons(model.config) == []


def test_decoder_refuses_unsupported_model() -> None:
    # LookaheadDecoder checks at construction, before any work
    with pytest.raises(UnsupportedModelError, match="sliding"):
        LookaheadDecoder(tiny(MistralConfig(**TINY)), StubTokenizer())  # type: ignore[arg-type]


def test_load_model_refuses_unsupported_model(tmp_path: Path) -> None:
    # load_model checks right after loading (the saved directory has no tokenizer: never reached)
    tiny(MistralConfig(**TINY)).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="sliding"):
        load_model(str(tmp_path))
