"""Device and dtype are first-class (placement.py): the CPU kernels take fp32 CPU tensors only.

Every CPU-only kernel entry point refuses a bf16 or a meta tensor with one line (never reaching the kernel,
which would read a device pointer or another dtype's bytes as floats); a bf16 (or non-CPU) model is offered
the stock twin only, and its forwards of several rows attend by sdpa, never by ``attend.cpp``. Kernels are
faked where the check must stop before them, so nothing here needs a kernel built.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from lookahead_core import DecodingConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.forward import attend
from lookahead_core.forward.gemv import gemv_product
from lookahead_core.forward.kernels import KERNELS, STOCK, KernelSet, available, make_twin
from lookahead_core.forward.lean import Norm
from lookahead_core.forward.lean_ops import FusedOps
from lookahead_core.forward.packed import PackedLinear, onednn_available, onednn_product
from lookahead_core.forward.placement import PlacementError, cpu_kernels_ok, model_ok
from lookahead_core.forward.ragged import RAGGED_ATTENTION, RaggedPlan
from lookahead_core.forward.rows import rows_product
from lookahead_core.forward.split import split_product
from lookahead_core.forward.step_layout import PLAN_KWARG, Segment, causal_visible
from lookahead_core.forward.wmajor import weight_major_product
from lookahead_core.kv.kvstore import KVShape, RequestKV
from torch import nn

from tests.core.helpers import StubTokenizer, eos_as, random_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

BAD = ("bfloat16", "meta")  # a tensor of another dtype, a tensor on another device
IN, OUT = 16, 8  # a product's in and out features


def bad(kind: str, *shape: int) -> torch.Tensor:
    """A tensor the CPU kernels must refuse: bf16 on the CPU, or fp32 on the meta device."""
    return torch.randn(*shape).bfloat16() if kind == "bfloat16" else torch.empty(*shape, device="meta")


class Unreachable:
    """A kernel build that fails the test if any of its functions is called."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        raise AssertionError(f"the kernel's {name} was reached")


def refused(call: Callable[[], object], kind: str) -> None:
    """``call()`` raises the placement error: one line naming the kernels' dtype and what it was handed."""
    with pytest.raises(PlacementError) as caught:
        call()
    text = str(caught.value)
    assert isinstance(caught.value, TypeError) and "\n" not in text
    assert "torch.float32" in text and ("bfloat16" in text if kind == "bfloat16" else "meta" in text)


@functools.cache
def bf16_llama() -> nn.Module:
    """The tiny llama in bf16 (a copy: ``tiny_model`` is shared by the process's tests)."""
    return copy.deepcopy(tiny_model("llama")).to(torch.bfloat16).eval()


# ---- the one place ------------------------------------------------------------------------------
def test_only_fp32_on_the_cpu_reaches_the_cpu_kernels() -> None:
    assert cpu_kernels_ok(torch.device("cpu"), torch.float32)
    assert cpu_kernels_ok("cpu", torch.float32)
    for device, dtype in (("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.float32),
                          ("cuda:1", torch.float32), ("meta", torch.float32),
                          (torch.device("cuda", 0), torch.bfloat16)):
        assert not cpu_kernels_ok(device, dtype), (device, dtype)
    assert model_ok(tiny_model("llama")) and not model_ok(bf16_llama())


# ---- every entry point refuses ------------------------------------------------------------------
PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "gemv": gemv_product, "rows": rows_product, "onednn": onednn_product, "weight-major": weight_major_product,
    "split": functools.partial(split_product, parts=2),
}


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("which", ["x", "weight", "bias"])
@pytest.mark.parametrize("kernel", sorted(PRODUCTS))
def test_every_product_refuses_a_tensor_of_another_dtype_or_device(kernel: str, which: str, kind: str) -> None:
    args = {"x": torch.randn(1, IN), "weight": torch.randn(OUT, IN), "bias": torch.randn(OUT)}
    args[which] = bad(kind, *args[which].shape)
    refused(lambda: PRODUCTS[kernel](args["x"], args["weight"], args["bias"]), kind)


@pytest.mark.parametrize("kernel", ["weight-major", "split"])
def test_the_guard_lets_fp32_cpu_products_through(kernel: str) -> None:
    # the torch-only products run everywhere: the guard must not refuse what they take
    x, w, b = torch.randn(3, IN), torch.randn(OUT, IN), torch.randn(OUT)
    torch.testing.assert_close(PRODUCTS[kernel](x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", BAD)
def test_a_packed_layer_refuses_weights_and_inputs_of_another_dtype_or_device(kind: str) -> None:
    linear = nn.Linear(IN, OUT)
    linear.weight = nn.Parameter(bad(kind, OUT, IN), requires_grad=False)
    refused(lambda: PackedLinear(linear), kind)
    if onednn_available():  # a packed layer of fp32 weights refuses another input
        packed = PackedLinear(nn.Linear(IN, OUT))
        refused(lambda: packed(bad(kind, 1, IN)), kind)


@pytest.mark.parametrize("kind", BAD)
def test_the_lean_steps_refuse_tensors_of_another_dtype_or_device(kind: str) -> None:
    ops = FusedOps(Unreachable(), lanes=8)  # type: ignore[arg-type]
    norm = Norm(torch.ones(IN), 1e-6)
    refused(lambda: ops.add_norm(bad(kind, 1, 2, IN), None, norm), kind)
    refused(lambda: ops.add_norm(torch.randn(1, 2, IN), bad(kind, 1, 2, IN), norm), kind)
    refused(lambda: ops.add_norm(torch.randn(1, 2, IN), None, Norm(bad(kind, IN), 1e-6)), kind)
    heads, head_dim = 2, 4
    width = (heads + 2) * head_dim  # q of two heads, k and v of one

    def rotate(qkv: torch.Tensor, kv: RequestKV) -> None:
        cos, sin = torch.randn(1, 2, head_dim), torch.randn(1, 2, head_dim)
        ops.rotate_and_cache(qkv, cos, sin, kv, 0, 0, heads, head_dim, rotary=None)  # type: ignore[arg-type]

    cpu = RequestKV(KVShape(1, 1, head_dim, torch.float32, torch.device("cpu")), 4)
    other = RequestKV(KVShape(1, 1, head_dim, torch.bfloat16, torch.device("cpu")), 4) if kind == "bfloat16" else \
        RequestKV(KVShape(1, 1, head_dim, torch.float32, torch.device("meta")), 4)
    refused(lambda: rotate(bad(kind, 1, 2, width), cpu), kind)
    refused(lambda: rotate(torch.randn(1, 2, width), other), kind)


def segment_args(rows: int = 3, past: int = 2, heads: int = 2, kv_heads: int = 1, head_dim: int = 16
                 ) -> dict[str, list]:
    """``attend_segments``' arguments of one segment, fp32 on the CPU."""
    return {"qs": [torch.randn(1, heads, rows, head_dim)],
            "keys": [torch.randn(1, kv_heads, past + rows, head_dim)],
            "values": [torch.randn(1, kv_heads, past + rows, head_dim)], "pasts": [past],
            "visibles": [torch.ones(rows, rows, dtype=torch.bool).tril()],
            "outs": [torch.empty(rows, heads * head_dim)]}


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("which", ["qs", "keys", "values", "outs", "visibles"])
def test_the_attention_kernel_refuses_tensors_of_another_dtype_or_device(which: str, kind: str) -> None:
    args = segment_args()
    t = args[which][0]
    if which == "visibles":  # the mask is bool: only its device can be wrong
        if kind != "meta":
            pytest.skip("a mask's dtype is the kernel's own check")
        args[which] = [torch.empty(t.shape, dtype=torch.bool, device="meta")]
    else:
        args[which] = [bad(kind, *t.shape)]
    refused(lambda: attend.attend_segments(Unreachable(), args["qs"], args["keys"], args["values"],  # type: ignore[arg-type]
                                           args["pasts"], args["visibles"], 0.25, args["outs"]), kind)


def test_the_attention_guard_lets_fp32_cpu_segments_through() -> None:
    calls: list[int] = []

    class Recorder:
        def attend_segments(self, qs: list[torch.Tensor], *args: object) -> None:
            calls.append(len(qs))

    args = segment_args()
    attend.attend_segments(Recorder(), args["qs"], args["keys"], args["values"], args["pasts"],  # type: ignore[arg-type]
                           args["visibles"], 0.25, args["outs"])
    assert calls == [1]


# ---- routing: a bf16 model gets the stock twin and sdpa -------------------------------------------
def test_a_bf16_model_is_offered_no_kernel_but_stock() -> None:
    fp32, bf16 = tiny_model("llama"), bf16_llama()
    assert available(fp32, "split", threads=2)  # the same model in fp32 is offered more (the check is the dtype)
    for kernel in KERNELS:
        assert available(bf16, kernel, threads=2) is (kernel == STOCK), kernel
    meta = copy.deepcopy(fp32).to("meta")
    assert [k for k in KERNELS if available(meta, k, threads=2)] == [STOCK]
    assert KernelSet(bf16, RAGGED_ATTENTION, KERNELS, threads=2).names == [STOCK]
    with pytest.raises(ValueError, match="fp32 on the CPU"):
        make_twin(bf16, "fused", RAGGED_ATTENTION, threads=2)


class RefusingKernel:
    """A build of the attention kernel whose tile divides the tiny models' heads and that refuses to run."""

    calls = 0

    def tile(self) -> int:
        return 8  # the tiny models' head_dim (16) is a multiple: only placement keeps it away

    def attend_segments(self, *args: object) -> None:
        RefusingKernel.calls += 1
        raise AssertionError("the attention kernel was reached")


@pytest.fixture
def refusing_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forward of several rows that would attend by the kernel reaches ``RefusingKernel``."""
    RefusingKernel.calls = 0
    monkeypatch.setattr(attend, "kernel", RefusingKernel)


def ragged_logits(model: nn.Module, prompts: list[list[int]]) -> torch.Tensor:
    """One ragged forward of every prompt (a segment each, nothing cached) through the model's stock twin:
    the logits of every row, [rows, vocab]."""
    twin = make_twin(model, STOCK, RAGGED_ATTENTION)
    shape = KVShape.of(model)
    segments, start = [], 0
    for ids in prompts:
        segments.append(Segment(RequestKV(shape, len(ids)), start, 0, causal_visible(len(ids))))
        start += len(ids)
    plan = RaggedPlan(segments)
    plan.finalize(shape.dtype, shape.device)
    ids = [t for p in prompts for t in p]
    positions = [i for p in prompts for i in range(len(p))]
    with torch.inference_mode():
        return twin(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), use_cache=False,
                    logits_to_keep=torch.arange(len(ids)), **{PLAN_KWARG: plan}).logits[0]


@pytest.mark.usefixtures("refusing_kernel")
def test_a_bf16_ragged_forward_of_several_rows_never_reaches_the_attention_kernel() -> None:
    prompts = [list(range(3, 12)), list(range(40, 45))]
    with pytest.raises(AssertionError, match="was reached"):  # fp32: the same forward runs the kernel
        ragged_logits(tiny_model("llama"), prompts)
    model = bf16_llama()
    got = ragged_logits(model, prompts)  # bf16: sdpa, segment by segment
    with torch.inference_mode():
        want = torch.cat([model(torch.tensor([p])).logits[0] for p in prompts])  # the stock causal forwards
    assert got.dtype == torch.bfloat16 and RefusingKernel.calls == 1
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)


# ---- bf16 end to end ------------------------------------------------------------------------------
MAX_NEW = 24
QUICK_CALIBRATION = SchedulerConfig(max_running=1, calibration_counts=(1, 4, 16), calibration_past=16,
                                    calibration_repeats=1)


@pytest.mark.usefixtures("refusing_kernel")
def test_a_bf16_model_decodes_with_speculation_and_calibration() -> None:
    # the calibration's probe forwards and the trees' forwards are several rows: none reaches the kernel
    model = bf16_llama()
    rng = random.Random(7)
    prompts = [random_prompt(rng) for _ in range(4)]
    with eos_as(model, None):
        spec = LookaheadDecoder(model, StubTokenizer(), DecodingConfig(max_new_tokens=MAX_NEW),  # type: ignore[arg-type]
                                scheduler=QUICK_CALIBRATION)
        plain = LookaheadDecoder(model, StubTokenizer(), DecodingConfig(max_new_tokens=MAX_NEW, mode="none"),  # type: ignore[arg-type]
                                 kernels=STOCK)
        assert spec.kernels.names == [STOCK] and spec.kernels.curve is not None  # measured, stock only
        for prompt in prompts:
            got = spec.generate(prompt)
            assert len(got.output_ids) == MAX_NEW
            assert got.stats.forward_steps <= MAX_NEW
            assert len(plain.generate(prompt).output_ids) == MAX_NEW
    assert RefusingKernel.calls == 0
