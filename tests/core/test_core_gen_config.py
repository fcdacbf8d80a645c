"""The model's own generation_config processors apply in greedy decoding too, as in ``generate``.

A tiny model whose generation_config sets repetition_penalty, no_repeat_ngram_size, suppress_tokens
or min_new_tokens (one case each), or has no EOS at all: every draft mode of the LookaheadDecoder, the
StepScheduler and the reference ``generate_sampled`` at temperature 0 all equal
``model.generate(do_sample=False)``, which the settings visibly change.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.request import ServeRequest
from lookahead_core.sampling import generate_sampled
from transformers import PreTrainedModel

from tests.core.helpers import (
    FAMILIES,
    MODES,
    Client,
    StubTokenizer,
    eos_as,
    generation_config_as,
    greedy,
    oracle_drafter,
    random_prompt,
    run_all,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 24
N_PROMPTS = 3


@functools.cache
def prompts() -> tuple[tuple[int, ...], ...]:
    rng = random.Random(99)
    return tuple(tuple(random_prompt(rng)) for _ in range(N_PROMPTS))


def plain(model: PreTrainedModel, prompt: tuple[int, ...]) -> list[int]:
    """Fixed-length greedy with the model's generation_config untouched (no processors)."""
    with eos_as(model, None):
        return greedy(model, list(prompt), MAX_NEW)


def early_token(model: PreTrainedModel, prompt: tuple[int, ...]) -> int:
    """A token plain greedy emits early (as EOS it would end the run after 3 tokens)."""
    return plain(model, prompt)[2]


# Each case: the generation_config fields it sets, from the model and prompt (the EOS stays None unless set).
CASES: dict[str, Callable[[PreTrainedModel, tuple[int, ...]], dict[str, Any]]] = {
    # CTRL penalty on every token already in the prompt or output
    "repetition_penalty": lambda m, p: {"repetition_penalty": 1.8, "eos_token_id": None},
    # no bigram twice
    "no_repeat_ngram_size": lambda m, p: {"no_repeat_ngram_size": 2, "eos_token_id": None},
    # the tokens plain greedy likes most are never emitted
    "suppress_tokens": lambda m, p: {"suppress_tokens": sorted(set(plain(m, p)[:6])), "eos_token_id": None},
    # EOS = a token greedy emits third, held back for 10 tokens
    "min_new_tokens": lambda m, p: {"min_new_tokens": 10, "eos_token_id": early_token(m, p)},
    # no EOS: min_new_tokens means nothing (generate adds no processor), the bigram ban still applies
    "eos_none": lambda m, p: {"eos_token_id": None, "min_new_tokens": 10, "no_repeat_ngram_size": 3},
}


def expected(model: PreTrainedModel, prompt: tuple[int, ...]) -> list[int]:
    """generate(do_sample=False) under the model's current generation_config."""
    return greedy(model, list(prompt), MAX_NEW)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES)
def test_decoder_applies_generation_config_in_greedy(family: str, case: str) -> None:
    # every mode equals generate's greedy, and generate's greedy differs from plain greedy (the setting bites)
    model = tiny_model(family)
    changed = []
    for prompt in prompts():
        fields = CASES[case](model, prompt)
        with generation_config_as(model, **fields):
            want = expected(model, prompt)
            dec = LookaheadDecoder(model, StubTokenizer(), kernels="stock")  # type: ignore[arg-type]
            right = oracle_drafter(len(prompt), want)
            for mode in MODES:
                cfg = DecodingConfig(mode=mode, max_new_tokens=MAX_NEW, decoding_length=8)
                assert dec.generate(list(prompt), config=cfg).output_ids == want, mode
                assert dec.generate(list(prompt), config=cfg, drafter=right).output_ids == want, f"{mode}, right drafts"
            ref = generate_sampled(model, StubTokenizer(), list(prompt), DecodingConfig(max_new_tokens=MAX_NEW))
            assert ref == want  # the reference at temperature 0 is generate's greedy
        changed.append(want != plain(model, prompt))
    assert any(changed)  # the setting changes generate's output: the equality above says something


def test_min_new_tokens_holds_eos_back() -> None:
    # the EOS greedy would emit third comes no earlier than token 10, then may end the run
    model = tiny_model("llama")
    prompt = prompts()[0]
    eos = early_token(model, prompt)
    with generation_config_as(model, min_new_tokens=10, eos_token_id=eos):
        out = LookaheadDecoder(model, StubTokenizer(), kernels="stock").generate(  # type: ignore[arg-type]
            list(prompt), config=DecodingConfig(max_new_tokens=MAX_NEW)).output_ids
    assert eos not in out[:10]


def test_request_repetition_penalty_overrides_the_models() -> None:
    # the request's 1.0 turns the model's penalty off: plain greedy again
    model = tiny_model("qwen2")
    prompt = prompts()[1]
    with generation_config_as(model, repetition_penalty=1.8, eos_token_id=None):
        dec = LookaheadDecoder(model, StubTokenizer(), kernels="stock")  # type: ignore[arg-type]
        out = dec.generate(list(prompt), config=DecodingConfig(max_new_tokens=MAX_NEW, repetition_penalty=1.0))
    assert out.output_ids == plain(model, prompt)


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_applies_generation_config(family: str, scheduler_of) -> None:
    # the engine builds each request's processors from the model's generation_config: greedy requests of
    # every mode equal generate, a sampled one equals its reference (penalty and warpers together)
    model = tiny_model(family)
    with generation_config_as(model, repetition_penalty=1.5, no_repeat_ngram_size=3, eos_token_id=None):
        sched = scheduler_of(model)
        configs = [DecodingConfig(mode=m, max_new_tokens=MAX_NEW, decoding_length=6) for m in MODES]
        configs.append(DecodingConfig(temperature=0.7, top_k=30, seed=4, max_new_tokens=MAX_NEW))
        prompt_list = [list(prompts()[i % N_PROMPTS]) for i in range(len(configs))]
        clients = [Client() for _ in configs]
        reqs = [ServeRequest(p, cfg, on_tokens=c.on_tokens, on_done=c.on_done)
                for p, cfg, c in zip(prompt_list, configs, clients, strict=True)]
        run_all(sched, reqs, clients)
        for p, cfg, r, c in zip(prompt_list, configs, reqs, clients, strict=True):
            assert c.error is None
            want = generate_sampled(model, StubTokenizer(), p, cfg)  # type: ignore[arg-type]
            assert r.output == want
            if not cfg.sampling:
                assert want == expected(model, tuple(p))
