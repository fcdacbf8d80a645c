"""The fused kernel (``forward/fused.py``): q/k/v and gate/up as one product over one joined weight storage,
the stock result bit for bit at one row, plain greedy's tokens through the engine; and no second copy."""

from __future__ import annotations

import copy
import random
from functools import cache

import lookahead_core.forward.fused as fused_module
import numpy as np
import pytest
import torch
from lookahead_core import DecodingConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.forward.fused import FusedMember, fuse_weights, joined
from lookahead_core.forward.kernels import CostCurve, KernelSet, keep, make_twin
from lookahead_core.forward.memory import drop_file_pages, resident
from lookahead_core.forward.packed import OneDNNLinear, packable
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from tests.core.conftest import NO_CALIBRATION
from tests.core.helpers import FAMILIES, StubTokenizer, eos_as, greedy, random_prompt, tiny_model

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # what the fused kernel joins per layer


@cache
def biased(family: str) -> PreTrainedModel:
    """The tiny model of ``family`` with random (non-zero) biases, its own copy: qwen2's q/k/v biases are
    initialised to zero, so a kernel that dropped them would still pass on the stock tiny model."""
    model = copy.deepcopy(tiny_model(family))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen))
    return model


def groups_of(model: PreTrainedModel) -> list[list[torch.Tensor]]:
    """Every layer's q/k/v and gate/up weights (and biases), one list per group."""
    out = []
    for layer in model.model.layers:
        for names, parent in zip(GROUPS, (layer.self_attn, layer.mlp), strict=True):
            out.append([getattr(parent, n).weight for n in names])
            if getattr(parent, names[0]).bias is not None:
                out.append([getattr(parent, n).bias for n in names])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_fuse_weights_joins_the_models_own_parameters_and_changes_no_logit(family: str) -> None:
    model = copy.deepcopy(biased(family))
    params = {id(p) for p in model.parameters()}
    ids = torch.tensor([random_prompt(random.Random(1))])  # [1, T]
    with torch.inference_mode():
        want = model(input_ids=ids).logits  # [1, T, vocab]
    assert not all(joined(g) for g in groups_of(model))
    assert fuse_weights(model) == 2 * len(model.model.layers)
    assert all(joined(g) for g in groups_of(model))  # each group: rows of one storage
    assert {id(p) for p in model.parameters()} == params  # the same Parameter objects (twins share them)
    storages = [g[0].untyped_storage().data_ptr() for g in groups_of(model)]
    fuse_weights(model)  # joined already: nothing is copied again
    assert [g[0].untyped_storage().data_ptr() for g in groups_of(model)] == storages
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_twin_is_the_model_bit_for_bit_at_one_token(family: str, two_threads: None) -> None:
    model = biased(family)
    twin = make_twin(model, "fused", attn_implementation=None)
    members = [m for m in twin.modules() if isinstance(m, FusedMember)]
    assert len(members) == 5 * len(model.model.layers)  # q, k, v, gate, up of every layer
    assert_twin_is_the_model_at_one_token(model, twin, seed=2)


def assert_twin_is_the_model_at_one_token(model: PreTrainedModel, twin: torch.nn.Module, seed: int) -> None:
    """``twin`` shares ``model``'s parameters (no copy), gives its logits bit for bit at one token and
    up to summation order on a whole random prompt."""
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    ids = torch.tensor([random_prompt(random.Random(seed))])  # [1, T]
    with torch.inference_mode():
        one = ids[:, :1]  # [1, 1]
        assert torch.equal(twin(input_ids=one).logits, model(input_ids=one).logits)
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-4)


def product_shapes(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[int, ...]]:
    """The weight shape of every call of ``fused.<name>`` (a group's product) from now on."""
    calls: list[tuple[int, ...]] = []
    product = getattr(fused_module, name)

    def counted(x: torch.Tensor, weight: torch.Tensor, *rest: object) -> torch.Tensor:
        calls.append(tuple(weight.shape))
        return product(x, weight, *rest)

    monkeypatch.setattr(fused_module, name, counted)
    return calls


def joined_shapes(model: PreTrainedModel) -> list[tuple[int, int]]:
    """Every layer's joined q/k/v and gate/up weight shapes, in call order."""
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim  # rows of the joined q/k/v
    per_layer = [(qkv, config.hidden_size), (2 * config.intermediate_size, config.hidden_size)]
    return per_layer * config.num_hidden_layers


def test_a_group_is_multiplied_once_per_forward(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model = biased("qwen2")
    twin = make_twin(model, "fused", attn_implementation=None)
    calls = product_shapes(monkeypatch, "split_product")
    with torch.inference_mode():
        twin(input_ids=torch.tensor([[5, 6, 7]]))
    want = joined_shapes(model)
    assert [c for c in calls if c in want] == want


@pytest.mark.parametrize("kernel", ["split", "fused"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_on_a_row_split_kernel_is_greedy(family: str, kernel: str, two_threads: None) -> None:
    assert_decoder_is_greedy_on(kernel, family, seed=11)


def assert_decoder_is_greedy_on(kernel: str, family: str, seed: int) -> None:
    """The decoder forced onto ``kernel`` gives plain greedy's tokens, one token a step and with trees."""
    model = biased(family)  # qwen2: biased q/k/v, random biases
    prompt = random_prompt(random.Random(seed))
    with eos_as(model, None):
        want = greedy(model, prompt, 24)
        for mode in ("none", "hierarchical"):
            config = DecodingConfig(mode=mode, max_new_tokens=24)
            decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels=kernel, scheduler=NO_CALIBRATION)
            assert decoder.kernels.names == [kernel]
            assert decoder.generate(prompt).output_ids == want


@pytest.mark.skipif(not packable(tiny_model("llama")), reason="torch build without oneDNN")
@pytest.mark.parametrize("family", FAMILIES)
def test_onednn_twin_shares_the_weights_and_is_greedy(family: str) -> None:
    model = biased(family)
    twin = make_twin(model, "onednn", attn_implementation=None)
    assert any(isinstance(m, OneDNNLinear) for m in twin.modules())
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    assert not any(b.numel() > 0 for b in twin.buffers() if b.data_ptr() not in {t.data_ptr() for t in model.buffers()})
    ids = torch.tensor([random_prompt(random.Random(6))])  # [1, T]
    with torch.inference_mode():
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-4)
    prompt = random_prompt(random.Random(12))
    with eos_as(model, None):
        want = greedy(model, prompt, 24)
        config = DecodingConfig(mode="hierarchical", max_new_tokens=24)
        decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels="onednn", scheduler=NO_CALIBRATION)
        assert decoder.generate(prompt).output_ids == want


def test_fused_needs_two_threads() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert "fused" not in KernelSet(copy.deepcopy(tiny_model("llama")), None).names
    finally:
        torch.set_num_threads(before)


def test_a_copying_twin_is_kept_only_where_it_saves_enough() -> None:
    counts = (1, 8)
    close = CostCurve(counts, {"stock": (1.0, 5.0), "packed": (2.0, 4.7)})  # packed 6% faster at 8: not worth a copy
    assert keep(close) == ["stock"]
    far = CostCurve(counts, {"stock": (1.0, 5.0), "packed": (2.0, 4.0)})  # 20% faster at 8
    assert keep(far) == ["stock", "packed"]
    assert keep(close, min_gain=0.0) == ["stock", "packed"]
    sharing = CostCurve(counts, {"stock": (1.0, 5.0), "split": (2.0, 4.9)})  # sharing twins win on any margin
    assert keep(sharing) == ["stock", "split"]


@pytest.mark.skipif(not packable(tiny_model("llama")), reason="torch build without oneDNN")
def test_a_dropped_packed_twin_gives_its_memory_back() -> None:
    config = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                         vocab_size=256)  # 54 MB of Linear weights: the packed twin's copy is as big
    model = AutoModelForCausalLM.from_config(config).float().eval()
    scratch = torch.ones(32 << 20, dtype=torch.uint8)  # a big block freed (as loading does): glibc then serves
    del scratch
    ks = KernelSet(model, None, kernels=("stock", "packed"))  # the packed weights from its heap
    built = resident().anon
    now = [0.0]
    cost = {id(ks.twins["stock"]): 1.0, id(ks.twins["packed"]): 2.0}  # stock wins everywhere: packed goes

    def probe(twin: torch.nn.Module, n: int) -> None:
        now[0] += cost[id(twin)]

    ks.calibrate(probe, (1, 8), repeats=1, clock=lambda: now[0])
    assert ks.names == ["stock"]
    assert resident().anon < built - (46 << 20)  # the copy (53 MiB) went back, free lists included


def test_one_token_forwards_run_a_kernel_that_is_stock_bit_for_bit() -> None:
    ks = KernelSet(tiny_model("llama"), None, kernels=("stock", "onednn"))
    now = [0.0]
    cost = {id(ks.twins["stock"]): {1: 3.0, 8: 9.0}, id(ks.twins["onednn"]): {1: 2.0, 8: 4.0}}  # onednn faster

    def probe(twin: torch.nn.Module, n: int) -> None:
        now[0] += cost[id(twin)][n]

    ks.calibrate(probe, (1, 8), repeats=1, clock=lambda: now[0])
    assert ks.names == ["stock", "onednn"]  # stock kept for the one-token forwards of plain decoding
    assert ks.runner(1) is ks.twins["stock"] and ks.runner(2) is ks.twins["onednn"]
    assert ks.describe() == "onednn, 1 token: stock"
    assert keep(CostCurve((1, 8), {"onednn": (2.0, 4.0)})) == ["onednn"]  # no exact kernel held: the fastest


def test_drop_file_pages_lets_go_of_mapped_file_pages_only(tmp_path: object) -> None:
    path = f"{tmp_path}/weights.bin"
    values = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    values.tofile(path)
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c"))  # a private file mapping, as safetensors
    assert torch.equal(mapped, torch.from_numpy(values))  # read: every page resident now
    before = resident().file
    span = [(mapped.data_ptr(), mapped.numel() * 4)]
    assert drop_file_pages(span) >= 15 << 20  # whole pages inside the span
    assert resident().file < before - (8 << 20)
    assert torch.equal(mapped, torch.from_numpy(values))  # touched again: read back from the file
    anon = torch.arange(1 << 20, dtype=torch.float32)
    assert drop_file_pages([(anon.data_ptr(), anon.numel() * 4)]) == 0  # heap memory is never dropped
    assert torch.equal(anon, torch.arange(1 << 20, dtype=torch.float32))
