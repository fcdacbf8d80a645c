"""The lean layer loop (``forward/lean.py``): the fused twin's ragged forwards without their plumbing.

It is offered only where a prefill and a short greedy decoding through it give the wrapped twin's logits
and cache entries bit for bit, so these tests check that it does on both families (biased q/k/v included):
at one token (the gemv twin's bits, plain greedy's), on a tree beside a second request; that the engine on
it is plain greedy; that a call without a ragged plan goes to the twin; and that a loop off by one ulp, or
a layer it does not know, is never offered."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from lookahead_core.forward import lean as lean_module
from lookahead_core.forward.kernels import EXACT, GEMV, LEAN, LEAN_DNN, ONEDNN, KernelSet, make_twin
from lookahead_core.forward.lean import LeanTwin, lean_layers, lean_ok, lean_ops, matches
from lookahead_core.forward.lean_ops import Ops, StockOps
from lookahead_core.forward.ragged import RaggedPlan
from lookahead_core.forward.step_layout import PLAN_KWARG, Segment, causal_visible
from lookahead_core.kv.kvstore import KVShape, RequestKV
from torch import nn

from tests.core.helpers import FAMILIES, random_prompt
from tests.core.test_core_fused import assert_decoder_is_greedy_on, biased
from tests.core.test_core_gemv import needs_the_copied_order

pytestmark = [
    pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                       reason="the lean loop wraps the exact GEMV, which needs AVX2"),
    needs_the_copied_order,
]


def lean_of(model: nn.Module, kernel: str = LEAN) -> LeanTwin:
    """The ``kernel`` lean twin of ``model`` (a ragged one: the loop runs only under a ragged plan)."""
    twin = make_twin(model, kernel, attn_implementation="lookahead_ragged")
    assert isinstance(twin, LeanTwin)
    return twin


def run(runner: nn.Module, kv: RequestKV, ids: list[int]) -> torch.Tensor:
    """Logits of ``ids`` appended to ``kv`` (one causal segment): [len(ids), vocab]."""
    past, n = kv.length, len(ids)
    plan = RaggedPlan([Segment(kv, 0, past, causal_visible(n))])
    plan.finalize(torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        logits = runner(input_ids=torch.tensor([ids]), position_ids=torch.arange(past, past + n)[None],
                        use_cache=False, logits_to_keep=torch.arange(n), **{PLAN_KWARG: plan}).logits
    kv.length = past + n
    return logits[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_loop_is_the_gemv_twin_bit_for_bit(family: str, two_threads: None) -> None:
    model = biased(family)  # qwen2: random q/k/v biases, so a dropped bias shows
    lean = lean_of(model)
    assert lean.ops is lean_ops(model, lambda: make_twin(model, GEMV, "lookahead_ragged"), LEAN)  # the steps checked
    assert {id(p) for p in lean.parameters()} <= {id(p) for p in model.parameters()}  # no copy
    gemv = make_twin(model, GEMV, attn_implementation="lookahead_ragged")
    prompt = random_prompt(random.Random(5))
    caches = [RequestKV(KVShape.of(model), len(prompt) + 8) for _ in range(2)]
    for kv in caches:
        run(gemv, kv, prompt)  # the same prompt KV in both
    token = prompt[-1]
    for _ in range(8):  # a decoding past a growing cache: every logit, then every entry written, equal
        want, got = run(gemv, caches[0], [token]), run(lean, caches[1], [token])
        assert torch.equal(want, got)
        token = int(want[-1].argmax())
    for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values, strict=True):
        assert torch.equal(a[:, :, : caches[0].length], b[:, :, : caches[1].length])


def test_every_ragged_forward_takes_the_loop_and_a_plain_call_the_twin(two_threads: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = biased("llama")
    lean = lean_of(model)
    taken: list[int] = []
    step = LeanTwin.step

    def counted(self: LeanTwin, ids: torch.Tensor, *rest: object) -> torch.Tensor:
        taken.append(ids.shape[1])
        return step(self, ids, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(LeanTwin, "step", counted)
    kv = RequestKV(KVShape.of(model), 16)
    run(lean, kv, [5, 6, 7])  # a prefill chunk
    run(lean, kv, [8])  # one token
    assert taken == [3, 1]
    with torch.inference_mode():
        make_twin(model, LEAN, attn_implementation=None)(input_ids=torch.tensor([[9]]))  # no plan: the twin
    assert taken == [3, 1]


def two_requests(model: nn.Module, runner: nn.Module) -> tuple[torch.Tensor, list[RequestKV]]:
    """One forward of two requests through ``runner``: a 3-token tree (root, two children) over a 6-entry
    cache, then one token of a second request over its 4 entries; returns the logits [5, vocab] and caches."""
    shape = KVShape.of(model)
    kvs = [RequestKV(shape, 16), RequestKV(shape, 16)]
    run(runner, kvs[0], [3, 1, 4, 1, 5, 9])
    run(runner, kvs[1], [2, 6, 5, 3])
    tree = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)  # both children see the root only
    plan = RaggedPlan([Segment(kvs[0], 0, 6, tree), Segment(kvs[1], 3, 4, causal_visible(1))])
    plan.finalize(torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        logits = runner(input_ids=torch.tensor([[7, 8, 9, 10]]), position_ids=torch.tensor([[6, 7, 7, 4]]),
                        use_cache=False, logits_to_keep=torch.arange(4), **{PLAN_KWARG: plan}).logits
    return logits[0], kvs


@pytest.mark.parametrize("kernel", [LEAN, LEAN_DNN])  # past one row: the rows kernel, oneDNN
@pytest.mark.parametrize("family", FAMILIES)
def test_a_tree_and_a_second_request_in_one_forward_are_the_twins_bit_for_bit(family: str, kernel: str,
                                                                             two_threads: None) -> None:
    model = biased(family)
    lean = lean_of(model, kernel)
    want, want_kv = two_requests(model, lean.twin)  # the twin the loop wraps, through HF's graph and ragged attention
    got, got_kv = two_requests(model, lean)
    assert torch.equal(got, want)
    for a, b in zip(want_kv, got_kv, strict=True):
        for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
            assert torch.equal(x[:, :, : a.length], y[:, :, : b.length])
    torch.testing.assert_close(got, two_requests(model, make_twin(model, "stock", "lookahead_ragged"))[0],
                               rtol=1e-4, atol=1e-4)  # and the stock model's up to summation order


@pytest.mark.parametrize("kernel", [LEAN, LEAN_DNN])
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_on_the_lean_twin_is_greedy(family: str, kernel: str, two_threads: None) -> None:
    assert_decoder_is_greedy_on(kernel, family, seed=17)


class OneUlpOff:
    """Steps whose every normed value is one ulp up."""

    def __init__(self, ops: Ops) -> None:
        self.ops, self.name = ops, f"off/{ops.name}"
        self.rotate_and_cache = ops.rotate_and_cache

    def add_norm(self, x: torch.Tensor, d: torch.Tensor | None, norm: object) -> tuple[torch.Tensor, torch.Tensor]:
        total, normed = self.ops.add_norm(x, d, norm)  # type: ignore[arg-type]
        return total, torch.nextafter(normed, torch.full_like(normed, float("inf")))


def test_a_loop_one_ulp_off_is_not_offered(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model = copy.deepcopy(biased("llama"))  # its own copy: lean_ok's answer is kept per model
    real = lean_module.candidates
    monkeypatch.setattr(lean_module, "candidates", lambda: [OneUlpOff(ops) for ops in real()])
    assert not matches(LeanTwin.of(make_twin(model, GEMV, "lookahead_ragged"), OneUlpOff(StockOps())))
    assert not lean_ok(model, lambda: make_twin(model, GEMV, "lookahead_ragged"), LEAN)
    held = KernelSet(model, "lookahead_ragged").names
    assert LEAN not in held and LEAN_DNN not in held  # the engine never holds a lean twin ...
    assert GEMV in held and ONEDNN in held  # ... and holds the products it would have made instead


def test_a_layer_the_loop_does_not_know_is_not_taken(two_threads: None) -> None:
    model = copy.deepcopy(biased("qwen2"))

    class OtherNorm(nn.Module):  # an RMSNorm of another formula (e.g. Gemma's 1 + weight)
        def __init__(self, norm: nn.Module) -> None:
            super().__init__()
            self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * (1 + self.weight)

    layer = model.model.layers[1]
    layer.input_layernorm = OtherNorm(layer.input_layernorm)
    layer.post_attention_layernorm = OtherNorm(layer.post_attention_layernorm)
    gemv = make_twin(model, GEMV, attn_implementation="lookahead_ragged")
    assert lean_layers(gemv) is None
    with pytest.raises(ValueError, match="Llama/Qwen2"):
        LeanTwin.of(gemv, StockOps())
    assert not lean_ok(model, lambda: gemv, LEAN)
    held = KernelSet(model, "lookahead_ragged").names
    assert LEAN not in held and GEMV in held  # the default set falls back to the gemv twin


def test_the_lean_twin_counts_as_exact_and_is_checked_once(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LEAN in EXACT and LEAN_DNN in EXACT  # one_token() may run plain decoding's steps on them: bits checked
    model = copy.deepcopy(biased("llama"))
    checks: list[int] = []
    real = lean_module.matches
    monkeypatch.setattr(lean_module, "matches", lambda t: checks.append(1) or real(t))
    assert lean_ok(model, lambda: make_twin(model, GEMV, "lookahead_ragged"), LEAN)
    tried = len(checks)  # the candidates up to the first that matches
    assert lean_ok(model, lambda: make_twin(model, GEMV, "lookahead_ragged"), LEAN)
    assert len(checks) == tried >= 1  # the answer is kept per model
