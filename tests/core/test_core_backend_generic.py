"""The device-generic backend forced on CPU: the same tokens as plain greedy, each request in its own slot.

Every test runs the one engine (``StepScheduler``) with ``backend="generic"``: tiny random llama and qwen2
models in fp32 must give ``model.generate(do_sample=False)``'s tokens token for token in a mixed batch, beside
adversarial drafts, across prefix-cache hits, with exact numerics' tiles cutting trees; another tenant's KV
(NaNs planted in every slot the request does not hold) changes nothing; a request longer than a slot fails
alone. The real model in bf16 with exact numerics gives its own one-token decoding's tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from lookahead_core.config import DraftMode
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.forward.backend import KVTooLong
from lookahead_core.forward.backend.base import CPU, GENERIC
from lookahead_core.forward.backend.choice import backend_name
from lookahead_core.forward.kernels import CostCurve
from lookahead_core.models import load_model

from tests.core.helpers import (
    FAMILIES,
    Client,
    eos_as,
    greedy,
    random_prompt,
    run_all,
    tiny_model,
)
from tests.core.serve_requests import adversarial_drafters, serve_request

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = [DraftMode.HIERARCHICAL, DraftMode.PARALLEL, DraftMode.LLMA, DraftMode.NONE]


def generic(exact: bool = False, **kw: object) -> SchedulerConfig:
    """A generic-backend engine config: small slots, small tiles (trees cross tile edges), no calibration."""
    fields: dict[str, object] = {"calibrate": False, "backend": GENERIC, "kv_slot_tokens": 160,
                                 "exact_numerics": exact, "exact_tile_rows": 4, **kw}
    return SchedulerConfig(**fields)  # type: ignore[arg-type]


def serve(sched: StepScheduler, prompts: Sequence[Sequence[int]], **cfg: object) -> list[ServeRequest]:
    clients = [Client() for _ in prompts]
    reqs = [serve_request(p, c, mode=MODES[i % 4], max_new_tokens=10 + 3 * i, **cfg) for i, (p, c) in
            enumerate(zip(prompts, clients, strict=True))]
    run_all(sched, reqs, clients)
    assert [c.error for c in clients] == [None] * len(prompts)
    assert [c.streamed for c in clients] == [r.output for r in reqs]
    return reqs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("exact", [False, True])
def test_mixed_batch_equals_greedy(family: str, exact: bool, scheduler_of) -> None:
    # 6 requests in every mode, prompts prefilled in 7-token chunks beside decodes: each is its own greedy run
    model = tiny_model(family)
    prompts = [random_prompt(random.Random(7 + i)) for i in range(6)]
    sched = scheduler_of(model, generic(exact, max_running=4, prefill_chunk=7, max_tokens_per_forward=40))
    with eos_as(model, None):
        reqs = serve(sched, prompts)
        assert [r.output for r in reqs] == [greedy(model, p, r.config.max_new_tokens) for p, r in zip(prompts, reqs,
                                                                                                   strict=True)]
    assert max(max(r.stats.batch_sizes) for r in reqs) > 1  # they shared forwards
    assert {k for r in reqs for k in r.stats.kernels} == {"generic-exact" if exact else "generic"}
    assert sched.backend.pool.free == 4  # every slot given back


def test_calibrated_engine_equals_greedy(scheduler_of) -> None:
    # the measured cost curve sizes the budgets (adaptive): still greedy's tokens
    model = tiny_model("llama")
    prompts = [random_prompt(random.Random(30 + i)) for i in range(4)]
    sched = scheduler_of(model, generic(calibrate=True, adaptive=True, calibration_counts=(1, 4, 16),
                                        calibration_repeats=1, calibration_past=32))
    assert sched.backend.curve is not None and sched.backend.curve.token_counts == (1, 4, 16)
    with eos_as(model, None):
        reqs = serve(sched, prompts)
        assert [r.output for r in reqs] == [greedy(model, p, r.config.max_new_tokens) for p, r in zip(prompts, reqs,
                                                                                                   strict=True)]


@pytest.mark.parametrize("exact", [False, True])
def test_adversarial_neighbours_never_change_tokens(exact: bool, scheduler_of) -> None:
    # wrong drafts, forks (an accepted path that is not contiguous) and an oracle, with tiles of 4 rows cutting
    # the 8-node trees: every output is its own greedy run, the oracle's drafts accepted
    model = tiny_model("qwen2")
    rng = random.Random(3)
    prompts = [random_prompt(rng) for _ in range(3)]
    with eos_as(model, None):
        truths = [greedy(model, p, 20) for p in prompts]
        drafters = adversarial_drafters(prompts, truths)
        sched = scheduler_of(model, generic(exact, adaptive=False))
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c, max_new_tokens=20, decoding_length=8, drafter=d)
                for p, c, d in zip(prompts, clients, drafters, strict=True)]
        run_all(sched, reqs, clients)
    assert [r.output for r in reqs] == truths
    assert reqs[2].stats.forward_steps < 10


@pytest.mark.parametrize("exact", [False, True])
def test_other_slots_never_reach_a_request(exact: bool, scheduler_of) -> None:
    # NaNs planted in every slot these requests do not hold and in the scratch slot (another tenant's KV, a
    # tile's padding): no output changes, the planted slots are untouched
    model = tiny_model("llama")
    prompts = [random_prompt(random.Random(40 + i)) for i in range(2)]
    sched = scheduler_of(model, generic(exact, max_running=4))
    pool = sched.backend.pool
    for buf in (*pool.keys, *pool.values):
        buf[2:].fill_(float("nan"))  # slots 2, 3 and the scratch slot (4); the requests take 0 and 1
    with eos_as(model, None):
        reqs = serve(sched, prompts)
        assert [r.output for r in reqs] == [greedy(model, p, r.config.max_new_tokens) for p, r in zip(prompts, reqs,
                                                                                                   strict=True)]
    assert all(buf[2:4].isnan().all() for buf in (*pool.keys, *pool.values))


def test_prefix_cache_hit_equals_miss(scheduler_of) -> None:
    # the same prompt twice: the second loads its prefix into its slot and skips prefill, same tokens
    model = tiny_model("qwen2")
    prompt = random_prompt(random.Random(9)) + random_prompt(random.Random(10))
    sched = scheduler_of(model, generic(prefix_min_tokens=4))
    with eos_as(model, None):
        outs = [serve(sched, [prompt])[0] for _ in range(2)]
        assert [r.output for r in outs] == [greedy(model, prompt, 10)] * 2
    assert [r.stats.prefix_hit_tokens for r in outs] == [0, len(prompt) - 1]


def test_a_request_longer_than_a_slot_fails_alone(scheduler_of) -> None:
    # prompt + max_new_tokens + a step over the slot's 160 entries: refused with KVTooLong at submit, before it
    # queues; its neighbour is greedy's
    model = tiny_model("llama")
    short = random_prompt(random.Random(1))
    sched = scheduler_of(model, generic())
    with pytest.raises(KVTooLong, match="pool slot holds 160"):
        sched.submit(serve_request(short, Client(), max_new_tokens=150))
    client = Client()
    req = serve_request(short, client, max_new_tokens=12)
    with eos_as(model, None):
        run_all(sched, [req], [client])
        assert client.error is None and req.output == greedy(model, short, 12)
    assert sched.backend.pool.free == sched.config.max_running  # the refused request never took a slot


def test_a_flat_cost_widens_only_what_fits_its_slot(scheduler_of) -> None:
    # a flat measured cost (a launch-bound device) widens draft budgets to 128, but never past the slot: the
    # request whose widened step would overflow its 160 entries keeps its configured 6 and is served, not refused
    model = tiny_model("llama")
    sched = scheduler_of(model, generic(adaptive=False))
    sched.backend._curve = CostCurve((1, 64, 256), {GENERIC: (0.01, 0.01, 0.01)})  # flat
    short = random_prompt(random.Random(2))[:16]
    long = random_prompt(random.Random(5))[:40]
    clients = [Client(), Client()]
    reqs = [serve_request(short, clients[0], max_new_tokens=12, mode=DraftMode.PARALLEL),  # 16 + 12 + 1 + 128 fits
            serve_request(long, clients[1], max_new_tokens=80, mode=DraftMode.PARALLEL)]  # 40 + 80 + 1 + 128 does not
    with eos_as(model, None):
        run_all(sched, reqs, clients)
        assert [c.error for c in clients] == [None, None]
        assert [r.output for r in reqs] == [greedy(model, short, 12), greedy(model, long, 80)]
    assert [r.config.decoding_length for r in reqs] == [128, 6]


def test_the_one_place_that_chooses() -> None:
    # auto: cpu for a CPU model, generic on CUDA or when exact numerics are asked; impossible choices refused
    assert backend_name("auto", "cpu", False) == CPU
    assert backend_name("auto", "cuda", False) == GENERIC
    assert backend_name("auto", "cpu", True) == GENERIC
    assert backend_name("generic", "cpu", False) == GENERIC
    with pytest.raises(ValueError, match="CPU models only"):
        backend_name("cpu", "cuda", False)
    with pytest.raises(ValueError, match="generic backend"):
        backend_name("cpu", "cpu", True)
    with pytest.raises(ValueError, match="backend must be one of"):
        backend_name("tpu", "cpu", False)


def test_a_cpu_model_gets_the_cpu_backend(scheduler_of) -> None:
    # the default engine on a CPU fp32 model: the CPU backend (kernel twins), a cache per request
    sched = scheduler_of(tiny_model("llama"))
    assert sched.backend.name == CPU


QUESTIONS = ("What is the capital of France? Answer in one sentence.", "Write a Python function that reverses a list.",
             "Explain what a hash map is.", "List three uses of the JSON format.",
             "How do I read a file line by line in Python?", "What does HTTP stand for?")


def outputs(model: object, tok: object, prompts: Sequence[Sequence[int]], mode: DraftMode) -> list[list[int]]:
    """``prompts`` served at once by an exact-numerics engine in ``mode``: each output."""
    sched = StepScheduler(model, tok, generic(True, max_running=len(prompts), kv_slot_tokens=256,  # type: ignore[arg-type]
                                              exact_tile_rows=16)).start()
    try:
        clients = [Client() for _ in prompts]
        reqs = [serve_request(p, c, mode=mode, max_new_tokens=48, decoding_length=8)
                for p, c in zip(prompts, clients, strict=True)]
        run_all(sched, reqs, clients)
        assert [c.error for c in clients] == [None] * len(prompts)
        return [r.output for r in reqs]
    finally:
        sched.close()


@pytest.mark.slow
def test_bf16_exact_numerics_equal_own_one_token_decoding() -> None:
    # SmolLM2 in bf16, exact numerics: 6 prompts batched with speculation give what each gives alone with no
    # drafts (one token a step), token for token (without exact numerics one of them differs from token 16 on)
    model, tok = load_model(dtype="bfloat16")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in QUESTIONS]
    alone = [outputs(model, tok, [p], DraftMode.NONE)[0] for p in prompts]
    assert outputs(model, tok, prompts, DraftMode.HIERARCHICAL) == alone
