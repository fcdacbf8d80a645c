"""Kernel twins and their choice by measurement (kernels.py, calibration.py); timings are injected.

Selection logic runs on a fake clock advanced by the probes, so no assertion depends on this
machine's speed; real forwards only check outputs (twins compute what the model computes).
"""

from __future__ import annotations

import copy
import gc
import math
import random
import weakref
from collections.abc import Callable, Iterator, Mapping

import lookahead_core.forward.kernels as kernels_module
import pytest
import torch
from lookahead_core import DecodingConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.forward.kernels import (
    KERNELS,
    CostCurve,
    KernelSet,
    describe,
    interpolate,
    make_twin,
    measure,
    settled,
)
from lookahead_core.forward.packed import PackedLinear, packable
from lookahead_core.forward.probe import RaggedProbe
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from lookahead_core.forward.rows import rows_ok
from lookahead_core.forward.shared import shared_kernels
from lookahead_core.forward.split import splittable
from lookahead_core.forward.step_layout import PLAN_KWARG
from lookahead_core.kv.kvstore import KVShape
from torch import nn

from tests.core.helpers import (
    StubTokenizer,
    eos_as,
    greedy,
    oracle_drafter,
    random_prompt,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")

needs_onednn = pytest.mark.skipif(not packable(tiny_model("llama")), reason="torch build without oneDNN")


class FakeClock:
    """A clock that only moves when a probe says its forward took so long."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_probe(
    clock: FakeClock, ks: KernelSet, seconds: Mapping[str, Mapping[int, float]]
) -> Callable[[nn.Module, int], None]:
    """A KernelSet probe whose forward of n tokens with twin k 'takes' seconds[k][n]."""
    names = {id(twin): name for name, twin in ks.twins.items()}

    def probe(module: nn.Module, n: int) -> None:
        clock.now += seconds[names[id(module)]][n]

    return probe


def fresh_model() -> nn.Module:
    """A tiny llama of its own (process-wide caches key on the model object)."""
    return copy.deepcopy(tiny_model("llama"))


# ---- interpolation and the cost curve -------------------------------------------------------------
@pytest.mark.parametrize(
    ("x", "want"),
    [
        (1, 1.0),  # a measured point
        (2, 1.2),  # between 1 and 4
        (6, 2.3),  # between 4 and 8
        (12, 4.4),  # past the last point: the 4..8 slope (0.35) continues
        (0, 1.0),  # before the first point: flat
    ],
)
def test_interpolate(x: int, want: float) -> None:
    assert interpolate((1, 4, 8), (1.0, 1.6, 3.0), x) == pytest.approx(want)


def test_interpolate_never_extrapolates_downwards() -> None:
    # the last segment falls (noise): past it the cost stays flat rather than dropping
    assert interpolate((1, 4, 8), (1.0, 3.0, 2.0), 20) == pytest.approx(2.0)
    # one measured point: a constant
    assert interpolate((4,), (2.5,), 64) == pytest.approx(2.5)


CURVE = CostCurve((1, 8), {"stock": (0.030, 0.070), "packed": (0.040, 0.050)})  # the docstring's example


@pytest.mark.parametrize(
    ("n", "kernel", "want"),
    [
        (1, None, 0.030),  # stock is cheapest at 1 token
        (8, None, 0.050),  # packed at 8
        (1, "packed", 0.040),  # a named kernel's own cost
        (4, "stock", 0.030 + 0.040 * 3 / 7),  # interpolated
        (15, None, 0.060),  # past 8: packed's slope continues
    ],
)
def test_cost_curve_cost(n: int, kernel: str | None, want: float) -> None:
    assert CURVE.cost(n, kernel) == pytest.approx(want)


def test_cost_curve_best_marginal_and_describe() -> None:
    assert [CURVE.best(n) for n in (1, 3, 4, 8, 64)] == ["stock", "stock", "packed", "packed", "packed"]
    assert CURVE.marginal(1) == pytest.approx(0.040 / 7)  # stock's slope
    assert CURVE.marginal(8) == pytest.approx(0.010 / 7)  # packed's slope
    assert describe(CURVE) == "stock<=3<packed"
    # three segments: stock wins again past a crossing (packed is steeper there)
    back = CostCurve((1, 4, 8), {"stock": (1.0, 3.0, 4.0), "packed": (2.0, 2.0, 6.0)})
    assert describe(back) == "stock<=2<packed<=5<stock"
    # a tie goes to the kernel listed first
    assert CostCurve((1,), {"packed": (1.0,), "stock": (1.0,)}).best(1) == "packed"


def test_cost_curve_round_trips_and_restricts() -> None:
    assert CostCurve.from_dict(CURVE.to_dict()) == CURVE
    assert CURVE.to_dict() == {"token_counts": [1, 8], "seconds": {"stock": [0.030, 0.070], "packed": [0.040, 0.050]}}
    only = CURVE.only(["packed"])
    assert only.kernels == ["packed"] and only.cost(1) == pytest.approx(0.040)


@pytest.mark.parametrize(
    ("counts", "seconds"),
    [
        ((8, 1), {"stock": (1.0, 2.0)}),  # counts not ascending
        ((1, 1), {"stock": (1.0, 2.0)}),  # a count twice
        ((1, 8), {"stock": (1.0,)}),  # one time missing
        ((1, 8), {}),  # no kernel
    ],
)
def test_cost_curve_rejects_malformed_measurements(counts: tuple[int, ...], seconds: dict) -> None:
    with pytest.raises(ValueError):
        CostCurve(counts, seconds)


# ---- measure ----------------------------------------------------------------------------------------
def test_measure_interleaves_kernels_skips_warmup_and_keeps_minimums() -> None:
    clock = FakeClock()
    calls: list[str] = []
    # per call, in order: the warm-up repetition first, then 3 timed ones
    durations = {("a", 1): [100.0, 1.0, 9.0, 2.0], ("a", 2): [100.0, 3.0, 3.0, 3.0],
                 ("b", 1): [50.0, 4.0, 4.0, 40.0], ("b", 2): [50.0, 5.0, 6.0, 7.0]}

    def probe(name: str) -> Callable[[int], None]:
        def run(n: int) -> None:
            calls.append(f"{name}{n}")
            clock.now += durations[(name, n)].pop(0)

        return run

    # every call repeated (no clear loser, no long size): the interleaving alone
    curve = measure({"a": probe("a"), "b": probe("b")}, (2, 1), repeats=3, warmup=1, clock=clock,
                    clear_loss=math.inf, long_s=math.inf)
    assert curve.token_counts == (1, 2)  # sorted
    assert curve.seconds == {"a": (1.0, 3.0), "b": (4.0, 5.0)}  # fastest timed call; the 100s / 50s warm-up ignored
    # each repetition runs every kernel at a size back to back, the first kernel alternating
    assert calls == ["a1", "b1", "a2", "b2", "b1", "a1", "b2", "a2"] * 2


def test_settled_names_clear_losers_and_long_sizes() -> None:
    # count 0: b is 3x a (a clear loser at 1.5x); count 1: a's 2.0 s is long, so both are timed once
    assert settled({"a": [[0.010], [2.0]], "b": [[0.030], [2.5]]}, 1.5, 1.0) == {("b", 0), ("a", 1), ("b", 1)}
    # a near tie at a short size: both repeat
    assert settled({"a": [[0.010]], "b": [[0.014]]}, 1.5, 1.0) == set()


def test_measure_repeats_only_where_the_choice_is_open() -> None:
    clock = FakeClock()
    calls: list[str] = []
    # count 1: b loses 3x on its first timed call; count 8: both take over a second
    durations = {("a", 1): [0.5, 0.010, 0.008, 0.009], ("b", 1): [0.5, 0.030],
                 ("a", 8): [5.0, 2.0], ("b", 8): [5.0, 2.5]}

    def probe(name: str) -> Callable[[int], None]:
        def run(n: int) -> None:
            calls.append(f"{name}{n}")
            clock.now += durations[(name, n)].pop(0)

        return run

    curve = measure({"a": probe("a"), "b": probe("b")}, (1, 8), repeats=3, warmup=1, clock=clock)
    # the fastest timing, or the one kept where timed once (the fake clock sums floats: approx)
    assert {k: pytest.approx(v) for k, v in curve.seconds.items()} == {"a": (0.008, 2.0), "b": (0.030, 2.5)}
    # warm-up and first timed repetition whole; then only a at count 1
    assert calls == ["a1", "b1", "a8", "b8", "b1", "a1", "b8", "a8", "a1", "a1"]


@pytest.mark.parametrize(("repeats", "warmup", "probes"), [(0, 1, 1), (1, -1, 1), (1, 0, 0)])
def test_measure_rejects_nothing_to_time(repeats: int, warmup: int, probes: int) -> None:
    # no timed repetition, a negative warm-up, no probe
    with pytest.raises(ValueError):
        measure({"a": lambda n: None} if probes else {}, (1,), repeats=repeats, warmup=warmup)


# ---- twins ----------------------------------------------------------------------------------------
def logits(module: nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return module(input_ids=torch.tensor([ids])).logits[0]  # [len(ids), vocab]


@needs_onednn
def test_packed_twin_shares_weights_and_leaves_the_model_alone() -> None:
    model = tiny_model("llama")
    twin = make_twin(model, "packed", attn_implementation="eager")
    # every parameter is the model's own tensor (no copy)
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}
    assert any(isinstance(m, PackedLinear) for m in twin.modules())
    assert twin.config._attn_implementation == "eager"
    # the model keeps the stock kernels and its own attention
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert model.config._attn_implementation == "sdpa"
    ids = random_prompt(random.Random(3))
    torch.testing.assert_close(logits(twin, ids), logits(model, ids), rtol=0, atol=1e-4)


def test_stock_twin_keeps_linear_and_may_keep_the_attention() -> None:
    model = tiny_model("qwen2", "eager")
    twin = make_twin(model, "stock", attn_implementation=None)
    assert twin is not model
    assert not any(isinstance(m, PackedLinear) for m in twin.modules())
    assert twin.config._attn_implementation == "eager"  # None keeps the model's attention
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight


def test_packed_twin_of_a_half_precision_model_is_refused() -> None:
    with pytest.raises(ValueError):
        make_twin(fresh_model().to(torch.bfloat16), "packed", attn_implementation=None)


# ---- KernelSet --------------------------------------------------------------------------------------
@needs_onednn
def test_kernel_set_runs_stock_until_calibrated() -> None:
    ks = KernelSet(tiny_model("llama"), RAGGED_ATTENTION, kernels=KERNELS)
    split = ["split", "fused"] if splittable(tiny_model("llama")) else []  # fp32 CPU with 2+ threads
    rows = ["rows"] if rows_ok(tiny_model("llama")) else []  # CPUs with AVX2 where its kernel builds
    assert ks.names == ["stock", *split, "onednn", "wmajor", *rows, "packed"]
    assert ks.curve is None and ks.describe() == "|".join(["stock", *split, "onednn", "wmajor", *rows, "packed"])
    assert ks.runner(1) is ks.twins["stock"] and ks.runner(64) is ks.twins["stock"]


@needs_onednn
def test_calibrate_picks_the_cheaper_twin_per_size() -> None:
    ks = KernelSet(tiny_model("llama"), RAGGED_ATTENTION, kernels=("stock", "packed"))
    stock, packed = ks.twins["stock"], ks.twins["packed"]
    clock = FakeClock()
    # stock cheaper at 1 token, packed from 4 on (the crossing is at 3.3 tokens)
    seconds = {"stock": {1: 1.0, 8: 5.0}, "packed": {1: 2.0, 8: 3.0}}
    curve = ks.calibrate(fake_probe(clock, ks, seconds), (1, 8), repeats=3, clock=clock)
    assert ks.names == ["stock", "packed"]  # each wins somewhere: both kept
    assert curve.seconds == {"stock": (1.0, 5.0), "packed": (2.0, 3.0)}
    assert [ks.runner(n) for n in (1, 3, 4, 8, 100)] == [stock, stock, packed, packed, packed]
    assert ks.describe() == "stock<=3<packed"


@needs_onednn
def test_calibrate_drops_twins_that_win_nowhere() -> None:
    ks = KernelSet(tiny_model("llama"), RAGGED_ATTENTION, kernels=("stock", "packed"))
    gone = weakref.ref(ks.twins["packed"])
    clock = FakeClock()
    # stock cheaper at every size measured
    seconds = {"stock": {1: 2.0, 8: 3.0}, "packed": {1: 3.0, 8: 9.0}}
    curve = ks.calibrate(fake_probe(clock, ks, seconds), (1, 8), repeats=1, clock=clock)
    assert ks.names == ["stock"] and curve.kernels == ["stock"]
    assert ks.measured is not None and ks.measured.kernels == ["stock", "packed"]  # the record keeps both
    gc.collect()
    assert gone() is None  # its memory went
    assert ks.runner(1) is ks.twins["stock"] and ks.describe() == "stock"


def test_the_default_kernel_set_holds_no_second_copy_of_a_weight() -> None:
    ks = KernelSet(tiny_model("llama"), RAGGED_ATTENTION)
    assert "packed" not in ks.names and "stock" in ks.names
    assert not any(isinstance(m, PackedLinear) for twin in ks.twins.values() for m in twin.modules())
    assert "packed" not in shared_kernels(copy.deepcopy(tiny_model("llama"))).names


def test_kernel_set_of_a_half_precision_model_is_stock_only() -> None:
    ks = KernelSet(fresh_model().to(torch.bfloat16), RAGGED_ATTENTION)
    assert ks.names == ["stock"]  # packed kernels need fp32 on CPU
    clock = FakeClock()
    # a scheduler may still calibrate it for the cost curve
    curve = ks.calibrate(fake_probe(clock, ks, {"stock": {1: 1.0, 4: 2.0}}), (1, 4), repeats=1, clock=clock)
    assert curve.cost(2) == pytest.approx(4 / 3) and ks.runner(4) is ks.twins["stock"]


@needs_onednn
def test_kernel_set_forced_to_one_kernel() -> None:
    ks = KernelSet(tiny_model("llama"), None, kernels=("packed",))
    assert ks.names == ["packed"] and ks.runner(1) is ks.twins["packed"]
    with pytest.raises(ValueError):
        KernelSet(tiny_model("llama"), None, kernels=("fast",))  # an unknown kernel


# ---- the engine's kernels --------------------------------------------------------------------------
@pytest.fixture
def counted() -> Iterator[tuple[KernelSet, dict[str, list[int]]]]:
    """A calibrated KernelSet on a tiny llama (stock at 1 token, packed from 2) and each twin's forward sizes."""
    if not packable(tiny_model("llama")):
        pytest.skip("torch build without oneDNN")
    ks = KernelSet(tiny_model("llama"), RAGGED_ATTENTION, kernels=("stock", "packed"))
    clock = FakeClock()
    ks.calibrate(fake_probe(clock, ks, {"stock": {1: 1.0, 2: 5.0, 16: 20.0}, "packed": {1: 2.0, 2: 2.5, 16: 3.0}}),
                 (1, 2, 16), repeats=1, clock=clock)
    sizes: dict[str, list[int]] = {"stock": [], "packed": []}
    handles = [twin.register_forward_pre_hook(lambda m, a, kw, name=name: sizes[name].append(kw["input_ids"].shape[1]),
                                              with_kwargs=True) for name, twin in ks.twins.items()]
    yield ks, sizes
    for handle in handles:
        handle.remove()


FIXED_TREES = SchedulerConfig(max_running=1, adaptive=False)  # every tree as drafted: the sizes below are known


def test_decoder_runs_each_forward_on_the_twin_chosen_for_its_size(counted: tuple) -> None:
    ks, sizes = counted
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(5))
    with eos_as(model, None):
        want = greedy(model, prompt, 8)
        # one token per step: the prompt on packed, every step on stock
        plain = LookaheadDecoder(model, StubTokenizer(), DecodingConfig(mode="none", max_new_tokens=8), kernels=ks,
                                 scheduler=FIXED_TREES)
        assert plain.generate(prompt).output_ids == want
        assert sizes == {"stock": [1] * 7, "packed": [len(prompt)]}
        # 4 drafts (5 tokens) per step: every forward on packed
        sizes["packed"].clear()
        dec = LookaheadDecoder(model, StubTokenizer(), DecodingConfig(max_new_tokens=8, decoding_length=4), kernels=ks,
                               scheduler=FIXED_TREES)
        res = dec.generate(prompt, drafter=oracle_drafter(len(prompt), want))
        assert res.output_ids == want
    # prompt, then 5 tokens (all accepted: 5 emitted), then 2 (room for 1 draft): 1 + 5 + 2 tokens
    assert sizes["stock"] == [1] * 7 and sizes["packed"] == [len(prompt), 5, 2]


def test_shared_kernels_are_built_and_timed_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple[int, ...]] = []
    real = kernels_module.measure
    monkeypatch.setattr(kernels_module, "measure", lambda *a, **kw: timed.append(tuple(a[1])) or real(*a, **kw))
    model = fresh_model()
    engine = SchedulerConfig(max_running=1, calibration_counts=(1, 4), calibration_repeats=1, calibration_past=8)
    ks = shared_kernels(model, "auto")
    assert ks is shared_kernels(model)  # the engine's one set
    assert LookaheadDecoder(model, StubTokenizer(), kernels="auto", scheduler=engine).kernels is ks
    assert LookaheadDecoder(model, StubTokenizer(), kernels="auto", scheduler=engine).kernels is ks
    assert timed == [(1, 4)] and ks.curve is not None and ks.curve.token_counts == (1, 4)  # timed once
    assert set(ks.names) <= {"stock", "fused", "onednn", "wmajor", "rows"}  # the default: twins that share the weights
    # forcing one kernel builds one twin and times nothing; another model gets its own set
    stock = shared_kernels(model, "stock")
    assert LookaheadDecoder(model, StubTokenizer(), kernels="stock", scheduler=engine).kernels is stock
    assert stock.names == ["stock"] and stock is not ks and stock.curve is None
    assert len(timed) == 1
    assert shared_kernels(fresh_model(), "stock") is not stock
    assert stock.attn_implementation == RAGGED_ATTENTION


def test_decoder_refuses_an_unknown_kernel_choice() -> None:
    with pytest.raises(ValueError):
        LookaheadDecoder(tiny_model("llama"), StubTokenizer(), kernels="fastest")


def test_ragged_probe_runs_one_forward_over_a_cache() -> None:
    model = tiny_model("llama")
    runner = KernelSet(model, RAGGED_ATTENTION, ("stock",)).twins["stock"]
    probe = RaggedProbe(KVShape.of(model), past=12)
    seen: list[tuple[int, int, int]] = []
    handle = runner.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["input_ids"].shape[1], kw[PLAN_KWARG].segments[0].past,
                                      kw[PLAN_KWARG].segments[0].q)), with_kwargs=True)
    try:
        probe(runner, 6)
        probe(runner, 1)
    finally:
        handle.remove()
    assert seen == [(6, 12, 6), (1, 12, 1)]  # n tokens over 12 cached entries, as one request's segment
