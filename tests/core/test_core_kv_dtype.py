"""A half KV cache where every forward reads it through the attention kernel (forward/backend/kv_dtype.py): what
``[generator] kv_dtype`` chooses, and speculation over a half cache equal to the one-token decoding over it."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from lookahead_core.config import DecodingConfig, DraftMode
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.attend import builds
from lookahead_core.forward.backend.kv_dtype import AUTO, FLOAT16, MODEL, cache_dtype
from lookahead_core.forward.quant.blocks import pack
from lookahead_core.forward.quant.kernel import kernel
from lookahead_core.forward.quant.linear import QuantWeight
from lookahead_core.forward.quant.load import install
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from .helpers import TINY_VOCAB, StubTokenizer, random_prompt, serve_mixed_modes, tiny_model

T = GGMLQuantizationType
needs_kernels = pytest.mark.skipif(kernel() is None or not builds(),
                                   reason="the block kernel or the attention kernel does not build here")


@functools.cache
def _wide_heads(family: str) -> nn.Module:
    """A tiny model whose heads are 64 wide (the attention kernel's output tile): fp32, random, eval."""
    common = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 64, "vocab_size": TINY_VOCAB, "max_position_embeddings": 1024}
    torch.manual_seed(3)
    config = LlamaConfig(**common) if family == "llama" else Qwen2Config(**common)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()


def quantized(model: nn.Module, qtype: GGMLQuantizationType) -> nn.Module:
    """A copy of ``model`` whose every Linear and embedding run ``qtype`` blocks of its own weights."""
    model = copy.deepcopy(model)
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            w = module.weight.detach().numpy()
            raw = quantize(w, qtype)
            module.weight.data = torch.from_numpy(dequantize(raw, qtype).reshape(w.shape).copy())
            found[path] = QuantWeight.of(pack(raw, qtype, *w.shape))
    return install(model, found, activations="float32")


@needs_kernels
def test_auto_gives_half_to_a_model_on_the_block_kernel_and_model_keeps_its_dtype() -> None:
    # 64-wide heads on the block kernel: every forward attends by the kernel, so the cache may be half
    model = quantized(_wide_heads("llama"), T.Q8_0)
    assert cache_dtype(model, AUTO) == cache_dtype(model, FLOAT16) == torch.float16
    assert cache_dtype(model, MODEL) == torch.float32


def test_a_model_whose_forwards_run_sdpa_keeps_its_dtype_and_float16_is_refused() -> None:
    # a dense model's one-token forwards run sdpa, which takes no half cache beside fp32 queries
    model = tiny_model("llama")
    assert cache_dtype(model, AUTO) == cache_dtype(model, MODEL) == torch.float32
    with pytest.raises(ValueError, match="block kernel"):
        cache_dtype(model, FLOAT16)
    with pytest.raises(ValueError, match="kv_dtype must be one of auto, model, float16"):
        cache_dtype(model, "bfloat16")


@needs_kernels
def test_heads_the_kernel_cannot_take_keep_the_models_dtype() -> None:
    # 16-wide heads (the small tiny models): no build's output tile divides them, sdpa attends, fp32 stays
    model = quantized(tiny_model("llama"), T.Q8_0)
    assert cache_dtype(model, AUTO) == torch.float32


@needs_kernels
@pytest.mark.parametrize("family,qtype", [("llama", T.Q4_1), ("qwen2", T.Q8_0)])
def test_speculation_over_a_half_cache_batched_is_the_one_token_decoding(family: str,
                                                                        qtype: GGMLQuantizationType) -> None:
    # every lossless mode, several requests in each forward, a half cache: the engine's own one-token decoding
    import random

    model, tok = quantized(_wide_heads(family), qtype), StubTokenizer()
    rng = random.Random(11)
    prompts = [random_prompt(rng) + random_prompt(rng)[:6] * 3 for _ in range(6)]  # repeats give the trie drafts
    plain = LookaheadDecoder(model, tok, DecodingConfig(mode=DraftMode.NONE, max_new_tokens=20))
    assert plain.scheduler.backend.shape.dtype == torch.float16  # the one-token decoding runs over a half cache too
    want = [plain.generate(p).output_ids for p in prompts]
    sched = StepScheduler(model, tok, SchedulerConfig(max_running=6, calibrate=False))
    assert sched.backend.shape.dtype == torch.float16
    reqs = serve_mixed_modes(sched, prompts, 20)
    assert [r.output for r in reqs] == want
