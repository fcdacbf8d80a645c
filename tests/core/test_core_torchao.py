"""Weight-only int8 / int4 by torchao for the generic backend (forward/quant/torchao_weights.py), on the CPU where
torchao's layout runs here (int8), and the one-line refusals where it does not (int4 off CUDA)."""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Sequence

import pytest
import torch
from lookahead_core.config import DecodingConfig, DraftMode
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.backend.base import GENERIC
from lookahead_core.forward.quant.load import weight_format
from lookahead_core.forward.quant.torchao_weights import INT4, INT8, weight_only
from lookahead_core.models import served_weights
from torch import nn

from tests.core.helpers import Client, StubTokenizer, eos_as, random_prompt, run_all, tiny_model

MODES = (DraftMode.HIERARCHICAL, DraftMode.PARALLEL, DraftMode.LLMA)


def int8_tiny(family: str) -> nn.Module:
    """A copy of the tiny ``family`` model with every Linear int8 weight-only by torchao."""
    return weight_only(copy.deepcopy(tiny_model(family)), INT8)


def served(model: nn.Module, prompts: Sequence[Sequence[int]], modes: Sequence[DraftMode]) -> list[list[int]]:
    """``prompts`` served at once (prompt i in ``modes[i]``) by a generic-backend engine with exact numerics."""
    config = SchedulerConfig(calibrate=False, backend=GENERIC, exact_numerics=True, exact_tile_rows=8,
                             kv_slot_tokens=160, max_running=len(prompts))
    sched = StepScheduler(model, StubTokenizer(), config).start()  # type: ignore[arg-type]
    try:
        clients = [Client() for _ in prompts]
        reqs = [ServeRequest(p, DecodingConfig(mode=m, max_new_tokens=20, decoding_length=6), tenant="t",
                             on_tokens=c.on_tokens, on_done=c.on_done)
                for p, m, c in zip(prompts, modes, clients, strict=True)]
        run_all(sched, reqs, clients)
        assert [c.error for c in clients] == [None] * len(prompts)
        return [r.output for r in reqs]
    finally:
        sched.close()


def test_int8_swaps_every_linear_and_names_the_format() -> None:
    # each Linear's weight becomes torchao's int8 tensor; its products stay within int8 rounding of the dense ones
    dense = tiny_model("llama")
    model = int8_tiny("llama")
    assert weight_format(model) == "int8 (torchao)" and weight_format(dense) == "float32"
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m.weight).__name__ != "Parameter" for m in linears)
    ids = torch.tensor([random_prompt(random.Random(0))])
    with torch.inference_mode():
        want, got = dense(ids).logits, model(ids).logits
    assert not torch.equal(want, got) and torch.allclose(want, got, atol=0.05)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_speculation_over_torchao_int8_is_its_one_token_decoding(family: str) -> None:
    # every lossless mode, several requests in each forward, fixed tiles: each answer is the same weights' own
    # one-token decoding, token for token
    model = int8_tiny(family)
    prompts = [random_prompt(random.Random(40 + i)) + random_prompt(random.Random(i))[:5] * 3 for i in range(5)]
    with eos_as(model, None):
        alone = [served(model, [p], [DraftMode.NONE])[0] for p in prompts]
        assert served(model, prompts, [MODES[i % len(MODES)] for i in range(len(prompts))]) == alone


def test_int4_off_cuda_and_unknown_choices_are_refused_in_one_line() -> None:
    model = copy.deepcopy(tiny_model("llama"))
    with pytest.raises(ValueError, match="int4 kernels on CUDA only"):
        weight_only(model, INT4)  # this model is on the CPU
    with pytest.raises(ValueError, match="int4 kernels on CUDA only"):
        served_weights(INT4, "smollm2-135m-instruct", "cpu")  # refused before anything loads
    with pytest.raises(ValueError, match="serves int8, int4, not 'int2'"):
        weight_only(model, "int2")
    assert all(type(m.weight).__name__ == "Parameter" for m in model.modules() if isinstance(m, nn.Linear))


def test_without_torchao_a_request_for_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # import fails as where torchao is missing
    with pytest.raises(RuntimeError, match=r"needs torchao \(pip install torchao\)"):
        weight_only(copy.deepcopy(tiny_model("llama")), INT8)


def test_importing_the_engine_with_torchao_installed_logs_nothing_of_it() -> None:
    # transformers imports torchao at its own import; its CUDA libraries' load failures stay out of a CPU start's log
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import lookahead_core.models, torchao"], capture_output=True,
                          text=True, timeout=120, check=True)
    assert "torchao" not in done.stderr and "Failed to load" not in done.stderr, done.stderr[-500:]
