"""Same seed, same tokens: lookahead sampling equals one-token-per-forward sampling (``generate_sampled``).

On tiny random llama and qwen2 models, through the batch-1 LookaheadDecoder (every draft mode, several
temperatures, top-p, top-k, min-p) and through the StepScheduler (a batch mixing greedy and sampled
requests), with trie drafts and with adversarial ones (all wrong, all right, forking, duplicated,
EOS-bearing). Drafts may change how many tokens a forward yields, never which tokens.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.drafting.draft import Drafter
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.sampling import generate_sampled
from transformers import PreTrainedModel

from tests.core import helpers as drafters  # the adversarial drafters
from tests.core.helpers import (
    FAMILIES,
    MODES,
    Client,
    StubTokenizer,
    duplicate_chains_drafter,
    eos_as,
    random_prompt,
    run_all,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 20
# (temperature, top_p, top_k, min_p): the sampling settings every mode is run under
SETTINGS = [
    (0.3, 1.0, 0, 0.0),
    (0.7, 1.0, 0, 0.0),
    (1.0, 1.0, 0, 0.0),
    (0.7, 0.9, 0, 0.0),  # nucleus
    (1.0, 1.0, 20, 0.0),  # top-k
    (0.8, 0.95, 40, 0.05),  # all warpers at once
]


def sampled(mode: str, setting: tuple[float, float, int, float], seed: int, **kw: object) -> DecodingConfig:
    temperature, top_p, top_k, min_p = setting
    fields: dict[str, object] = {"max_new_tokens": MAX_NEW, "decoding_length": 8, **kw}
    return DecodingConfig(mode=mode, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                          **fields)  # type: ignore[arg-type]


def reference(model: PreTrainedModel, prompt: list[int], config: DecodingConfig) -> list[int]:
    return generate_sampled(model, StubTokenizer(), prompt, config)  # type: ignore[arg-type]


def lookahead(model: PreTrainedModel, prompt: list[int], config: DecodingConfig, drafter: Drafter | None = None,
              kernels: str = "stock") -> list[int]:
    dec = LookaheadDecoder(model, StubTokenizer(), config, kernels=kernels)  # type: ignore[arg-type]
    return dec.generate(prompt, drafter=drafter).output_ids


@functools.cache
def prompts(n: int = 6) -> tuple[tuple[int, ...], ...]:
    rng = random.Random(2024)
    return tuple(tuple(random_prompt(rng)) for _ in range(n))


# ---- LookaheadDecoder, trie drafts ---------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "T{}-p{}-k{}-m{}".format(*s))
def test_decoder_equals_reference(family: str, mode: str, setting: tuple[float, float, int, float]) -> None:
    # every mode, every setting, two prompts and seeds: the lookahead output is the reference's
    model = tiny_model(family)
    with eos_as(model, None):
        for i, prompt in enumerate(prompts()[:2]):
            cfg = sampled(mode, setting, seed=1000 + i)
            want = reference(model, list(prompt), cfg)
            assert len(want) == MAX_NEW
            assert lookahead(model, list(prompt), cfg) == want


@pytest.mark.parametrize("family", FAMILIES)
def test_other_seed_other_output(family: str) -> None:
    # the check above can fail: another seed gives another sequence (the seed really drives the draw)
    model = tiny_model(family)
    with eos_as(model, None):
        prompt = list(prompts()[0])
        a = lookahead(model, prompt, sampled("hierarchical", SETTINGS[2], seed=1))
        b = lookahead(model, prompt, sampled("hierarchical", SETTINGS[2], seed=2))
    assert a != b


@pytest.mark.parametrize("family", FAMILIES)
def test_seed_is_recorded(family: str) -> None:
    # a sampled run without a seed records the random one it drew: replaying it gives the same output
    model = tiny_model(family)
    prompt = list(prompts()[1])
    with eos_as(model, None):
        dec = LookaheadDecoder(model, StubTokenizer(), kernels="stock")  # type: ignore[arg-type]
        first = dec.generate(prompt, config=DecodingConfig(temperature=1.0, max_new_tokens=MAX_NEW))
        assert first.stats.sampled and first.stats.seed is not None
        again = DecodingConfig(temperature=1.0, max_new_tokens=MAX_NEW, seed=first.stats.seed)
        assert reference(model, prompt, again) == first.output_ids
        greedy_run = dec.generate(prompt, config=DecodingConfig(max_new_tokens=4))
        assert (greedy_run.stats.sampled, greedy_run.stats.seed) == (False, None)


# ---- adversarial drafts ----------------------------------------------------------------------------
ADVERSARIAL: dict[str, Callable[[int, list[int]], Drafter]] = {
    "all-right": drafters.oracle_drafter,  # the reference continuation itself: everything accepted
    "all-wrong": drafters.wrong_drafter,  # nothing accepted
    "forking": drafters.forking_drafter,  # the right token behind a wrong sibling at every depth
    "duplicates": duplicate_chains_drafter,  # the accepted path runs through a later, parallel chain
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ADVERSARIAL)
@pytest.mark.parametrize("setting", [SETTINGS[0], SETTINGS[2], SETTINGS[5]], ids=["T0.3", "T1", "warpers"])
def test_adversarial_drafts_change_nothing(family: str, kind: str, setting: tuple[float, float, int, float]) -> None:
    # drafts built from the reference output (right, wrong, forked, duplicated) leave the output as it is
    model = tiny_model(family)
    with eos_as(model, None):
        for i, prompt in enumerate(prompts()[2:4]):
            cfg = sampled("hierarchical", setting, seed=77 + i, decoding_length=12)
            want = reference(model, list(prompt), cfg)
            drafter = ADVERSARIAL[kind](len(prompt), want)
            assert lookahead(model, list(prompt), cfg, drafter) == want


@pytest.mark.parametrize("family", FAMILIES)
def test_all_right_drafts_are_accepted(family: str) -> None:
    # the oracle's drafts are all accepted: the deep nodes really are checked against their own positions
    model = tiny_model(family)
    prompt = list(prompts()[4])
    with eos_as(model, None):
        cfg = sampled("hierarchical", SETTINGS[2], seed=5, decoding_length=12)
        want = reference(model, prompt, cfg)
        dec = LookaheadDecoder(model, StubTokenizer(), cfg, kernels="stock")  # type: ignore[arg-type]
        run = dec.generate(prompt, drafter=drafters.oracle_drafter(len(prompt), want))
    assert run.output_ids == want
    assert run.stats.forward_steps <= 2  # 1 prefill token + 12 + 1 per step: 20 tokens in two steps


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_bearing_drafts_stop_where_the_reference_stops(family: str) -> None:
    # EOS = a token the sampled run emits mid-way: drafts holding EOS at wrong places change nothing,
    # and drafts running past the true EOS stop there
    model = tiny_model(family)
    prompt = list(prompts()[5])
    cfg = sampled("hierarchical", SETTINGS[2], seed=11, decoding_length=12)
    with eos_as(model, None):
        free = reference(model, prompt, cfg)
    eos = free[7]
    with eos_as(model, eos):
        want = reference(model, prompt, cfg)
        assert want == free[: free.index(eos) + 1]
        assert lookahead(model, prompt, cfg, drafters.eos_drafter(len(prompt), free, eos)) == want
        assert lookahead(model, prompt, cfg, drafters.oracle_drafter(len(prompt), free)) == want


def test_packed_kernels_equal_reference() -> None:
    # the packed kernels give the same draws as the stock ones (a forward size never changes a token)
    model = tiny_model("llama")
    with eos_as(model, None):
        for mode in MODES:
            cfg = sampled(mode, SETTINGS[1], seed=3)
            prompt = list(prompts()[0])
            assert lookahead(model, prompt, cfg, kernels="packed") == reference(model, prompt, cfg)


# ---- the serving engine ---------------------------------------------------------------------------
def serve(prompt: list[int], client: Client, config: DecodingConfig, drafter: Drafter | None = None) -> ServeRequest:
    return ServeRequest(prompt, config, tenant="t", on_tokens=client.on_tokens, on_done=client.on_done,
                        drafter=drafter)


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_mixed_greedy_and_sampled_batch(family: str, scheduler_of) -> None:
    # 8 requests in one batch: greedy and sampled, every mode, different settings and lengths; each equals
    # its own one-token-per-forward reference (greedy: generate's greedy), and the stream is the output
    model = tiny_model(family)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=8))
    rng = random.Random(3)
    with eos_as(model, None):
        configs = []
        for i in range(8):
            mode = MODES[i % 4]
            if i % 3 == 0:
                configs.append(DecodingConfig(mode=mode, max_new_tokens=10 + i, decoding_length=6))
            else:
                configs.append(sampled(mode, SETTINGS[i % len(SETTINGS)], seed=500 + i, decoding_length=6))
        prompts_ = [random_prompt(rng) for _ in configs]
        clients = [Client() for _ in configs]
        reqs = [serve(p, c, cfg) for p, c, cfg in zip(prompts_, clients, configs, strict=True)]
        run_all(sched, reqs, clients)
        for p, r, c, cfg in zip(prompts_, reqs, clients, configs, strict=True):
            assert c.error is None
            assert c.streamed == r.output == reference(model, p, cfg)
            assert (r.stats.sampled, r.stats.seed) == (cfg.sampling, cfg.seed if cfg.sampling else None)
        assert max(max(r.stats.batch_sizes) for r in reqs) > 1  # they really shared forwards


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_adversarial_drafts(family: str, scheduler_of) -> None:
    # sampled requests fed right, wrong, forked and duplicated drafts side by side in one batch
    model = tiny_model(family)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=4))
    with eos_as(model, None):
        cases = []
        for i, kind in enumerate(ADVERSARIAL):
            prompt = list(prompts()[i])
            cfg = sampled("hierarchical", SETTINGS[i % 3], seed=900 + i, decoding_length=10)
            want = reference(model, prompt, cfg)
            cases.append((prompt, cfg, want, ADVERSARIAL[kind](len(prompt), want)))
        clients = [Client() for _ in cases]
        reqs = [serve(p, c, cfg, d) for (p, cfg, _, d), c in zip(cases, clients, strict=True)]
        run_all(sched, reqs, clients)
        for (_, _, want, _), r, c in zip(cases, reqs, clients, strict=True):
            assert c.error is None and r.output == want


def test_scheduler_refuses_an_unsupported_generation_config(scheduler_of) -> None:
    # a generation_config the chooser cannot apply fails the request (an error to its caller), not the engine
    model = tiny_model("llama")
    old = model.generation_config.guidance_scale
    model.generation_config.guidance_scale = 3.0
    try:
        sched = scheduler_of(model)
    finally:
        model.generation_config.guidance_scale = old
    for _ in range(2):  # the engine thread survives: the second request is answered (with the same error) too
        client = Client()
        run_all(sched, [serve(list(prompts()[0]), client, DecodingConfig(max_new_tokens=4))], [client])
        assert "guidance_scale" in str(client.error)
    assert sched.state().running == 0
