"""The real SmolLM2-135M-Instruct: sampled lookahead output equals the one-token-per-forward reference.

The 20 grounded chat prompts of test_core_real_model, each with its own seed, temperature 0.7 and
top-p 0.9, a draft mode per prompt: through the batch-1 LookaheadDecoder and all at once through the
StepScheduler. Short outputs keep it to a couple of minutes on 2 cores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
from lookahead_core import DecodingConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.sampling import generate_sampled
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tests.core.helpers import MODES, busy_engine, serve_at_once
from tests.core.test_core_real_model import grounded_prompts

pytestmark = pytest.mark.slow

MAX_NEW = 24
N_PROMPTS = 20


def config(i: int) -> DecodingConfig:
    """Prompt i's settings: its own seed and draft mode."""
    return DecodingConfig(mode=MODES[i % len(MODES)], temperature=0.7, top_p=0.9, seed=31 + i,
                          max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def prompts(smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> list[list[int]]:
    out = grounded_prompts(smollm[1])
    assert len(out) == N_PROMPTS
    return out


@pytest.fixture(scope="module")
def reference(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase], prompts: list[list[int]]
) -> Callable[[int], list[int]]:
    """The reference sampled output of prompt i, computed once."""

    @functools.cache
    def ref(i: int) -> list[int]:
        return generate_sampled(*smollm, prompts[i], config(i))

    return ref


def test_real_model_sampled_decoder_equals_reference(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    # every prompt, its mode and seed: token-for-token the reference; the seeds really differ the outputs
    decoder = LookaheadDecoder(*smollm)
    for i, prompt in enumerate(prompts):
        res = decoder.generate(prompt, config=config(i))
        assert res.output_ids == reference(i), f"prompt {i}, mode {config(i).mode}"
        assert (res.stats.sampled, res.stats.seed) == (True, 31 + i)
    other = generate_sampled(*smollm, prompts[0], DecodingConfig(temperature=0.7, top_p=0.9, seed=999,
                                                                 max_new_tokens=MAX_NEW))
    assert other != reference(0)


def test_real_model_sampled_scheduler_equals_reference(
    smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    prompts: list[list[int]],
    reference: Callable[[int], list[int]],
) -> None:
    # all 20 at once through the engine (8 running, chunked prefill): each is its own reference
    sched = busy_engine(*smollm, calibrate=False)
    reqs = serve_at_once(sched.start(), prompts, [config(i) for i in range(len(prompts))])
    for i, req in enumerate(reqs):
        assert req.output == reference(i), f"prompt {i}, mode {req.config.mode}"
    assert max(max(r.stats.batch_sizes) for r in reqs) > 1
