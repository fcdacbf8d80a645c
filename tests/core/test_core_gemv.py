"""The exact one-token product (``forward/gemv.py``, ``gemv.cpp``): MKL's fp32 GEMV summation order by hand.

The kernel is offered only where it gives the stock product's bits on the model's own weights, so these
tests check that rule, and, where this machine's MKL sums in the order the kernel copies (a numpy
re-enactment of that order agrees with ``F.linear``), that the kernel's bits are the stock ones for every
shape, alignment, bias and thread count."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lookahead_core.forward import gemv as gemv_module
from lookahead_core.forward.fused import FusedMember
from lookahead_core.forward.gemv import gemv_ok, gemv_product
from lookahead_core.forward.kernels import EXACT, KernelSet, make_twin
from lookahead_core.forward.split import single_row
from torch import nn

from tests.core.helpers import FAMILIES, tiny_model
from tests.core.test_core_fused import assert_decoder_is_greedy_on, assert_twin_is_the_model_at_one_token, biased

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="the exact GEMV needs AVX2"
)

ALIGNED = 4  # the peel where a weight row starts on a 16-byte boundary


def mkl_order(w: np.ndarray, x: np.ndarray, peel: int) -> np.float32:
    """One dot product in the order gemv.cpp copies, re-enacted in numpy fp32 (one rounding per step)."""
    f = np.float32
    s = f(w[0] * x[0])
    for k in range(1, peel):  # the head, in turn
        s = f(s + f(w[k] * x[k]))
    lanes = [s, f(0), f(0), f(0)]
    k = peel
    while k + 4 <= len(w):  # four lanes, lane 0 from the head
        for lane in range(4):
            lanes[lane] = f(lanes[lane] + f(w[k + lane] * x[k + lane]))
        k += 4
    s = f(f(lanes[0] + lanes[2]) + f(lanes[1] + lanes[3]))
    for j in range(k, len(w)):  # the products past the last whole four, in turn
        s = f(s + f(w[j] * x[j]))
    return s


def offset_weight(rows: int, cols: int, offset: int, gen: torch.Generator) -> torch.Tensor:
    """A random [rows, cols] weight starting ``offset`` floats past an aligned allocation (a checkpoint's
    mmapped tensors sit at any 4-byte offset)."""
    buf = torch.randn(rows * cols + offset, generator=gen)  # [rows * cols + offset]
    return buf[offset:].view(rows, cols)  # [rows, cols]


def mkl_sums_as_copied() -> bool:
    """Whether this machine's stock one-row product agrees with the re-enacted order (aligned and not)."""
    gen = torch.Generator().manual_seed(0)
    for offset in range(4):
        w = offset_weight(8, 64, offset, gen)  # [8, 64]
        x = torch.randn(64, generator=gen)  # [64]
        peel = ALIGNED - (w.data_ptr() % 16) // 4
        want = F.linear(x[None], w)[0].numpy()  # [8]
        if any(mkl_order(w[n].numpy(), x.numpy(), peel) != want[n] for n in range(8)):
            return False
    return True


MKL_AS_COPIED = mkl_sums_as_copied()
needs_the_copied_order = pytest.mark.skipif(not MKL_AS_COPIED, reason="this CPU's MKL sums otherwise (gemv_ok says no)")


@pytest.mark.parametrize("out_in", [(40, 16), (9, 64), (192, 576), (1536, 576), (576, 1536)])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])  # floats off a 16-byte boundary: peels 4, 3, 2, 1
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_product_is_a_dot_product_per_row(out_in: tuple[int, int], offset: int, with_bias: bool) -> None:
    # whatever the machine: the kernel multiplies (an odd row count covers the single-row tail), each output
    # within fp32 summation's error bound of the exact dot product (in * eps * sum |w x|, whatever its order)
    gen = torch.Generator().manual_seed(out_in[0] + offset)
    w = offset_weight(*out_in, offset, gen)  # [out, in]
    b = torch.randn(out_in[0], generator=gen) if with_bias else None  # [out]
    x = torch.randn(1, 1, out_in[1], generator=gen)  # [1, 1, in]: one row, leading dims kept
    got = gemv_product(x, w, b)  # [1, 1, out]
    assert got.shape == (1, 1, out_in[0])
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())  # [1, 1, out]
    bound = (out_in[1] + 1) * torch.finfo(torch.float32).eps * (
        F.linear(x.double().abs(), w.double().abs()) + (0.0 if b is None else b.double().abs()))  # [1, 1, out]
    assert bool(((got.double() - exact).abs() <= bound).all())


@needs_the_copied_order
@pytest.mark.parametrize("threads", [1, 2])  # the stock product's order does not depend on threads
@pytest.mark.parametrize("out_in", [(40, 16), (9, 64), (192, 576), (3072, 576), (576, 1536), (4864, 896)])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_the_product_is_the_stock_one_bit_for_bit(out_in: tuple[int, int], offset: int, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(7 * out_in[1] + offset)
        w = offset_weight(*out_in, offset, gen)  # [out, in]
        b = torch.randn(out_in[0], generator=gen)  # [out]
        for scale in (1.0, 1e3):  # ordinary rows, and large ones where a different order shows more
            x = scale * torch.randn(1, out_in[1], generator=gen)  # [1, in]
            assert torch.equal(gemv_product(x, w, None), F.linear(x, w))
            assert torch.equal(gemv_product(x, w, b), F.linear(x, w, b))  # the bias added after the sum
    finally:
        torch.set_num_threads(before)


def test_more_than_one_row_or_a_ragged_width_is_refused() -> None:
    with pytest.raises(RuntimeError, match="one row"):
        gemv_product(torch.randn(2, 16), torch.randn(4, 16), None)  # two rows
    with pytest.raises(RuntimeError, match="multiple of 4"):
        gemv_product(torch.randn(1, 18), torch.randn(4, 18), None)  # 18 is not lanes of four
    assert single_row(torch.randn(1, 1, 8)) and not single_row(torch.randn(1, 2, 8))


@needs_the_copied_order
@pytest.mark.parametrize("family", FAMILIES)
def test_the_gemv_twin_is_the_model_bit_for_bit_at_one_token(family: str, two_threads: None) -> None:
    model = biased(family)  # qwen2: biased q/k/v
    assert gemv_ok(model)
    twin = make_twin(model, "gemv", attn_implementation=None)
    assert any(isinstance(m, FusedMember) for m in twin.modules())  # fused, as the fused twin
    assert_twin_is_the_model_at_one_token(model, twin, seed=4)


def test_only_one_row_goes_through_the_gemv(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if not gemv_ok(tiny_model("llama")):
        pytest.skip("the gemv twin is not offered on this machine")
    twin = make_twin(tiny_model("llama"), "gemv", attn_implementation=None)
    rows: list[int] = []

    def counted(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        rows.append(x.numel() // x.shape[-1])
        return gemv_product(x, w, b)

    for m in twin.modules():  # every one-row product of the twin is the one passed to fuse_linears
        if getattr(m, "one_row", None) is not None:
            m.one_row = counted
        if isinstance(m, FusedMember):
            m.group.one_row = counted
    with torch.inference_mode():
        twin(input_ids=torch.tensor([[5, 6, 7]]))  # three rows: split products, no GEMV
        assert rows == []
        twin(input_ids=torch.tensor([[5]]))
    assert rows and set(rows) == {1}  # one token: every product by the GEMV


@needs_the_copied_order
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_on_the_gemv_twin_is_greedy(family: str, two_threads: None) -> None:
    assert_decoder_is_greedy_on("gemv", family, seed=13)


def test_a_kernel_that_changes_one_bit_is_not_offered(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model = copy.deepcopy(biased("llama"))  # its own copy: gemv_ok's answer is kept per model
    real = gemv_module.gemv_product

    def one_ulp_off(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = real(x, w, b)
        return torch.nextafter(y, torch.full_like(y, float("inf")))  # every output one ulp up

    monkeypatch.setattr(gemv_module, "gemv_product", one_ulp_off)
    assert not gemv_ok(model)
    assert "gemv" not in KernelSet(model, None).names  # the engine never holds it


def test_a_model_with_a_width_the_kernel_cannot_copy_is_not_offered(two_threads: None) -> None:
    model = copy.deepcopy(biased("llama"))
    layer = model.model.layers[0].mlp
    layer.down_proj = nn.Linear(layer.down_proj.in_features, 10, bias=False)  # a Linear of 10 outputs is fine ...
    assert gemv_ok(model) == MKL_AS_COPIED
    odd = copy.deepcopy(biased("qwen2"))
    odd.lm_head = nn.Linear(odd.lm_head.in_features, 5)  # ... but an in_features the lanes cannot cover is not
    odd.lm_head.in_features = 14
    odd.lm_head.weight = nn.Parameter(torch.randn(5, 14))
    assert not gemv_ok(odd)


def test_the_gemv_twin_counts_as_exact() -> None:
    assert "gemv" in EXACT  # one_token() may run plain decoding's steps on it: its bits were checked
