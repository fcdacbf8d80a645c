"""The rows kernel (``forward/rows.py``, ``rows_gemm.cpp``): every weight row read once for all of a tree's
rows; the stock product up to summation order for every row count, remainder and bias, plain greedy's
tokens through the engine, no second copy of a weight, and the GIL released while it multiplies."""

from __future__ import annotations

import copy
import random
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from lookahead_core.forward.fused import FusedMember
from lookahead_core.forward.kernels import LEAN, KernelSet, make_twin
from lookahead_core.forward.rows import (
    RowsLinear,
    avx2_extension,
    avx512_extension,
    extension,
    faster,
    rows_ok,
    rows_product,
)
from lookahead_core.threads import on_own_thread

from tests.core.helpers import FAMILIES, random_prompt, tiny_model
from tests.core.test_core_fused import assert_decoder_is_greedy_on, biased

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="the rows kernel needs AVX2 and FMA"
)


AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the AVX-512 kernel needs an AVX-512 CPU")
BUILDS = [pytest.param(avx2_extension, id="avx2"), pytest.param(avx512_extension, id="avx512", marks=needs_avx512)]


def test_the_kernel_builds_on_an_avx2_cpu() -> None:
    # g++ and ninja are part of the set-up (README): an AVX2 machine that cannot build it has a broken set-up
    assert avx2_extension() is not None
    # on an AVX-512 CPU the products run by whichever build timed faster, elsewhere by the AVX2 one
    assert extension() in ((avx512_extension(), avx2_extension()) if AVX512 else (avx2_extension(),))


class Build:
    """A stand-in build whose product takes ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    def rows_linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.delay_s)
        return F.linear(x, weight)


def test_the_faster_build_is_chosen_by_timing_it() -> None:
    slow, fast = Build(0.02), Build(0.0)
    assert faster([slow, fast], repeats=2) is fast  # type: ignore[list-item]
    assert faster([fast, slow], repeats=2) is fast  # type: ignore[list-item]  # in either order
    assert slow.calls == 2 * 3  # one untimed call, then the timed ones, each time
    lone = Build(0.0)
    assert faster([lone]) is lone and lone.calls == 0  # one build: nothing to time


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 8, 9, 13, 16, 23])  # each tile width (8-row and 6-row blocks)
@pytest.mark.parametrize("in_features", [16, 29, 48])  # whole lanes, a tail, whole AVX-512 lanes past one
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_rows_product_is_the_linear_product(build, rows: int, in_features: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * in_features)
    weight = torch.randn(43, in_features, generator=gen)  # [out, in]: 43 = whole 4-row tiles and 3 more
    bias = torch.randn(43, generator=gen) if with_bias else None  # [out]
    x = torch.randn(2, rows, in_features, generator=gen)  # [batch, rows, in]: leading dims are kept
    got = build().rows_linear(x, weight, bias)  # [2, rows, 43]
    assert got.shape == (2, rows, 43) and got.is_contiguous()  # callers .view() it into heads
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@needs_avx512
@pytest.mark.parametrize("out_features", [1, 2, 3, 4, 31, 32, 33, 70])  # the 1-3 row remainders, a block edge
def test_every_weight_row_of_the_avx512_kernel_is_computed(out_features: int) -> None:
    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, 40, generator=gen)  # [out, in]
    x = torch.randn(7, 40, generator=gen)  # [rows, in]
    torch.testing.assert_close(avx512_extension().rows_linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@needs_avx512
def test_a_row_sums_the_same_whatever_rows_come_with_it() -> None:
    # a request's logits must not depend on which other requests share its forward
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(37, 80, generator=gen), torch.randn(13, 80, generator=gen)  # [out, in], [rows, in]
    alone = avx512_extension().rows_linear(x[4:5], weight)  # [1, out]
    for together, row in ((x, 4), (x[:5], 4), (x[3:9], 1)):  # in a 6-row tile, a 5-row one, a 6-row one's second
        assert torch.equal(avx512_extension().rows_linear(together, weight)[row], alone[0])


def test_a_non_contiguous_input_is_read_as_its_values() -> None:
    weight = torch.randn(24, 16)  # [out, in]
    x = torch.randn(16, 5).t()  # [5, 16]: a transposed view
    torch.testing.assert_close(rows_product(x, weight, None), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_a_mismatched_input_is_refused_with_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="in_features"):
        rows_product(torch.randn(3, 8), torch.randn(4, 16), None)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rows_twin_shares_the_weights_and_computes_the_models_logits(family: str) -> None:
    model = biased(family)  # qwen2: biased q/k/v, random biases
    twin = make_twin(model, "rows", attn_implementation=None)
    assert not any(type(m) is torch.nn.Linear for m in twin.modules())  # every product by the kernel
    assert sum(isinstance(m, RowsLinear) for m in twin.modules()) == 7 * len(model.model.layers) + 1  # + lm_head
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    ids = torch.tensor([random_prompt(random.Random(4))])  # [1, T]
    with torch.inference_mode():
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_on_the_rows_kernel_is_greedy(family: str) -> None:
    assert_decoder_is_greedy_on("rows", family, seed=13)


def test_the_kernel_lets_other_python_threads_run() -> None:
    # it releases the GIL while it multiplies, as torch's own ops do: the service's event loop keeps streaming
    weight, x = torch.randn(2048, 4096), torch.randn(512, 4096)  # [out, in], [rows, in]: one call of ~0.1 s
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.01)  # the ticker is running
        started = time.perf_counter()
        rows_product(x, weight, None)
        ended = time.perf_counter()
    finally:
        stop.set()
        ticker.join()
    during = [t for t in ticks if started < t < ended]
    assert len(during) >= 10, (len(during), ended - started)  # a held GIL: no tick until the call returns


def test_the_kernel_leaves_its_threads_intra_op_count_alone() -> None:
    # a serving process sets torch's default to one thread and its engine thread claims more
    # (lookahead_core.threads); a product on the engine thread must not drop it back to the default
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def engine_step() -> int:
            rows_product(torch.randn(4, 64), torch.randn(256, 64), None)  # [4, 64] x [256, 64]^T
            return torch.get_num_threads()

        assert on_own_thread(engine_step, 2) == 2
    finally:
        torch.set_num_threads(before)


def test_rows_is_offered_for_fp32_cpu_models_only() -> None:
    assert rows_ok(tiny_model("llama"))
    half = copy.deepcopy(tiny_model("llama")).to(torch.bfloat16)  # its own copy: the tiny model is shared
    assert not rows_ok(half) and "rows" not in KernelSet(half, None).names
    ks = KernelSet(copy.deepcopy(biased("llama")), None)  # the default set measures its products:
    if LEAN in ks.names:  # in the lean twin (every product of several rows by this kernel) ...
        groups = [m.group for m in ks.twins[LEAN].modules() if isinstance(m, FusedMember)]
        assert groups and all(g.many_rows is rows_product for g in groups)
    else:  # ... or, where its loop is refused, in the rows twin
        assert "rows" in ks.names
