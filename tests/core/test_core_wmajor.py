"""The weight-major kernel (``forward/wmajor.py``): x W^T computed as (W x^T)^T on the model's own weights,
the stock product up to summation order, each joined group multiplied once, plain greedy's tokens through
the engine; and no second copy of a weight."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from lookahead_core.forward.fused import FusedMember
from lookahead_core.forward.kernels import KernelSet, make_twin
from lookahead_core.forward.wmajor import WeightMajorLinear, weight_major_product

from tests.core.helpers import FAMILIES, random_prompt
from tests.core.test_core_fused import assert_decoder_is_greedy_on, biased, joined_shapes, product_shapes


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_weight_major_product_is_the_linear_product(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 16, generator=gen)  # [out, in]
    bias = torch.randn(48, generator=gen) if with_bias else None  # [out]
    x = torch.randn(2, rows, 16, generator=gen)  # [batch, rows, in]: leading dims are kept
    got = weight_major_product(x, weight, bias)  # [2, rows, 48]
    assert got.shape == (2, rows, 48) and got.is_contiguous()  # callers .view() it into heads
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_weight_major_twin_shares_the_weights_and_computes_the_models_logits(family: str) -> None:
    model = biased(family)  # qwen2: biased q/k/v, random biases
    twin = make_twin(model, "wmajor", attn_implementation=None)
    members = [m for m in twin.modules() if isinstance(m, FusedMember)]
    assert len(members) == 5 * len(model.model.layers)  # q, k, v, gate, up of every layer: two products
    assert all(m.group.weight_major for m in members)
    others = [m for m in twin.modules() if isinstance(m, WeightMajorLinear)]
    assert len(others) == 2 * len(model.model.layers) + 1  # o_proj, down_proj of every layer, and the lm_head
    assert not any(type(m) is torch.nn.Linear for m in twin.modules())  # every product weight-major
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    ids = torch.tensor([random_prompt(random.Random(4))])  # [1, T]
    with torch.inference_mode():
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-4)


def test_a_joined_group_is_multiplied_once_per_forward_weight_major(monkeypatch: pytest.MonkeyPatch) -> None:
    model = biased("qwen2")
    twin = make_twin(model, "wmajor", attn_implementation=None)
    calls = product_shapes(monkeypatch, "weight_major_product")
    with torch.inference_mode():
        twin(input_ids=torch.tensor([[5, 6, 7]]))
    assert calls == joined_shapes(model)  # 2 products a layer, none split


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_on_the_weight_major_kernel_is_greedy(family: str) -> None:
    assert_decoder_is_greedy_on("wmajor", family, seed=13)


def test_a_default_kernel_set_builds_the_weight_major_twin_on_cpu() -> None:
    ks = KernelSet(copy.deepcopy(biased("llama")), None)  # the default: the kernels that share the weights
    assert "wmajor" in ks.names  # measured at start-up beside the others; kept only where it wins
