"""The split kernel (``forward/split.py``): Linear rows in per-thread blocks, the stock result bit for bit."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.kernels import KernelSet, make_twin
from lookahead_core.forward.shared import shared_kernels
from lookahead_core.forward.split import SplitLinear, split_linears, splittable
from torch import nn

from tests.core.helpers import StubTokenizer, random_prompt, tiny_model
from tests.core.test_core_fused import biased


@pytest.mark.parametrize("out_in", [(576, 576), (1536, 576), (576, 1536), (4096, 64)])
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 64])
def test_split_linear_is_stock_at_one_row_and_close_beyond(out_in: tuple[int, int], rows: int) -> None:
    out_features, in_features = out_in
    gen = torch.Generator().manual_seed(rows)
    linear = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
    x = torch.randn(1, rows, in_features, generator=gen)  # [1, M, in]: a packed row's hidden states
    split = SplitLinear(linear, parts=2)
    with torch.inference_mode():
        got, want = split(x), F.linear(x, linear.weight)
    assert got.shape == want.shape == (1, rows, out_features)
    if rows == 1:
        assert torch.equal(got, want)  # one row: the stock GEMV per block, bit for bit (plain decoding's path)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)  # a GEMM: summation order only


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_biased_split_linear_is_stock_at_one_row(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    linear = nn.Linear(896, 1152)  # qwen2's joined q/k/v shape, biased
    with torch.no_grad():
        linear.weight.copy_(torch.randn(1152, 896, generator=gen))
        linear.bias.copy_(torch.randn(1152, generator=gen))
    x = torch.randn(1, rows, 896, generator=gen)  # [1, M, in]
    with torch.inference_mode():
        got, want = SplitLinear(linear, parts=2)(x), linear(x)
        without = F.linear(x, linear.weight)  # the bias left out: must not pass
    assert not torch.allclose(got, without)
    if rows == 1:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_split_linears_swaps_the_layers_that_divide() -> None:
    block = nn.Sequential(nn.Linear(8, 6, bias=False), nn.Linear(6, 6, bias=True), nn.Linear(6, 5, bias=False))
    assert split_linears(block, parts=2) == 2  # the 5-row one stays stock
    assert isinstance(block[0], SplitLinear) and isinstance(block[1], SplitLinear) and type(block[2]) is nn.Linear
    assert split_linears(nn.Sequential(nn.Linear(8, 6, bias=False)), parts=1) == 0  # one block is stock
    with pytest.raises(ValueError):
        SplitLinear(nn.Linear(8, 5, bias=False), parts=2)  # rows do not divide


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_split_twin_shares_weights_and_gives_the_models_logits(family: str, two_threads: None) -> None:
    model = biased(family)  # qwen2: biased q/k/v, random biases
    twin = make_twin(model, "split", attn_implementation=None)
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    assert any(isinstance(m, SplitLinear) for m in twin.modules())
    assert not any(isinstance(m, SplitLinear) for m in model.modules())  # the model keeps stock
    ids = torch.tensor([random_prompt(random.Random(4))])  # [1, T]
    with torch.inference_mode():
        one = ids[:, :1]  # [1, 1]: a one-token forward, bit for bit
        assert torch.equal(twin(input_ids=one).logits, model(input_ids=one).logits)
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-4)


def test_split_is_not_offered_for_half_precision_or_one_thread(two_threads: None) -> None:
    half = copy.deepcopy(tiny_model("llama")).to(torch.bfloat16)  # its own copy: the tiny model is shared
    assert not splittable(half) and KernelSet(half, None).names == ["stock"]
    with pytest.raises(ValueError):
        make_twin(half, "split", attn_implementation=None)
    torch.set_num_threads(1)
    assert not splittable(tiny_model("llama"))  # one thread: nothing to spread the blocks over


def test_kernel_set_cuts_weights_for_the_forwards_threads_not_the_builders() -> None:
    # a serving process builds its kernels on a one-thread thread for an engine thread that runs with two
    # (lookahead_core.threads): split and fused must still be built, with two row blocks
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = tiny_model("llama")
        assert "fused" not in KernelSet(model, None).names  # sized by this thread: one block, nothing to split
        kernels = KernelSet(model, None, ("stock", "split", "fused"), threads=2)
        assert kernels.names == ["stock", "split", "fused"]
        split = [m for m in kernels.twins["split"].modules() if isinstance(m, SplitLinear)]
        assert split and all(m.parts == 2 for m in split)
    finally:
        torch.set_num_threads(before)


def test_the_engine_and_shared_sets_cut_weights_for_the_engine_threads() -> None:
    # serve_single_threaded leaves the building thread at one intra-op thread; the engine's step thread
    # runs with SchedulerConfig.threads, and its one-token kernel (fused: stock bit for bit) needs that count
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = copy.deepcopy(tiny_model("llama"))  # its own copy: shared kernel sets are per model
        sched = StepScheduler(model, StubTokenizer(), SchedulerConfig(threads=2, calibrate=False))  # type: ignore[arg-type]
        assert "fused" in sched.backend.kernels.names
        assert "fused" in shared_kernels(model, threads=2).names
        assert "fused" not in shared_kernels(model).names  # this thread's count: one
    finally:
        torch.set_num_threads(before)
