"""Keyed Gumbel noise, the processors' order and the token chooser, on hand-made logits (no model).

The chooser's contract (chooser.py): the choice after node i is a function of node i's context
(the step's context + its path tokens) and output position (``position + depth(i)``) only.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from lookahead_core.config import DecodingConfig
from lookahead_core.sampling import (
    GumbelCache,
    TokenChooser,
    UnsupportedGenerationConfig,
    build_processors,
    keyed_gumbel,
    resolve_seed,
)
from transformers import GenerationConfig

EULER_GAMMA = 0.5772156649  # mean of the standard Gumbel distribution
V = 6  # vocabulary of the hand-made logits


def chooser(config: DecodingConfig, gen: GenerationConfig | None = None, prompt_len: int = 2) -> TokenChooser:
    return TokenChooser.for_request(gen or GenerationConfig(), config, prompt_len, resolve_seed(config))


# ---- keyed_gumbel --------------------------------------------------------------------------------
def test_keyed_gumbel_is_a_function_of_seed_and_position() -> None:
    # same key twice: the very same noise; another seed or another position: other noise
    a = keyed_gumbel(7, 3, 1000)
    assert a.shape == (1000,) and a.dtype == torch.float32
    assert torch.equal(a, keyed_gumbel(7, 3, 1000))
    assert not torch.equal(a, keyed_gumbel(8, 3, 1000))
    assert not torch.equal(a, keyed_gumbel(7, 4, 1000))


def test_keyed_gumbel_is_the_same_in_another_process() -> None:
    # a fresh interpreter draws bit-identical noise (no process state, no torch RNG involved)
    code = "from lookahead_core.sampling.gumbel import keyed_gumbel; print(keyed_gumbel(2**64 - 1, 12345, 50).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert eval(out.stdout) == keyed_gumbel(2**64 - 1, 12345, 50).tolist()


def test_keyed_gumbel_is_standard_gumbel() -> None:
    # 200k draws: mean ~ Euler's gamma, variance ~ pi^2 / 6 (a wrong transform of u would miss both)
    g = keyed_gumbel(1, 0, 200_000).double()
    assert abs(g.mean().item() - EULER_GAMMA) < 0.01
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03
    assert torch.isfinite(g).all()


def test_keyed_gumbel_refuses_keys_out_of_range() -> None:
    # seeds are 64-bit: a negative or too large one is an error, not a silent wrap-around
    with pytest.raises(ValueError):
        keyed_gumbel(-1, 0, 4)
    with pytest.raises(ValueError):
        keyed_gumbel(2**64, 0, 4)


def test_gumbel_cache_draws_each_position_once_and_forgets_the_past() -> None:
    # cached noise equals a fresh draw; forget_before drops only earlier positions
    cache = GumbelCache(5, 32)
    for p in (3, 4, 5):
        assert torch.equal(cache(p), keyed_gumbel(5, p, 32))
    assert cache(4) is cache(4)
    cache.forget_before(5)
    assert len(cache) == 1 and torch.equal(cache(5), keyed_gumbel(5, 5, 32))


def test_resolve_seed() -> None:
    # greedy: no seed; sampling with a seed: that seed; without: a random 63-bit one, new each time
    assert resolve_seed(DecodingConfig(seed=3)) is None
    assert resolve_seed(DecodingConfig(temperature=1.0, seed=3)) == 3
    drawn = {resolve_seed(DecodingConfig(temperature=1.0)) for _ in range(8)}
    assert len(drawn) == 8 and all(0 <= s < 2**63 for s in drawn if s is not None)


# ---- processors ----------------------------------------------------------------------------------
def names(procs: object) -> list[str]:
    return [type(p).__name__ for p in procs]  # type: ignore[attr-defined]


def test_plain_greedy_has_no_processors() -> None:
    # a plain model and a greedy request: nothing to apply (the argmax fast path)
    assert names(build_processors(GenerationConfig(), DecodingConfig(), 4)) == []
    assert chooser(DecodingConfig()).plain


def test_processors_follow_generates_order() -> None:
    # model-side processors first in generate's order, then the warpers (temperature, top-k, top-p, min-p)
    gen = GenerationConfig(no_repeat_ngram_size=3, suppress_tokens=[1], min_new_tokens=2, eos_token_id=0,
                           repetition_penalty=1.3, top_k=7, temperature=0.1)
    cfg = DecodingConfig(temperature=0.5, top_k=4, top_p=0.9, min_p=0.1, seed=1)
    assert names(build_processors(gen, cfg, 4)) == [
        "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor", "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor", "SuppressTokensLogitsProcessor", "TemperatureLogitsWarper",
        "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
    ]


def test_request_fields_override_the_models() -> None:
    # the request's top_k (0: off) and temperature win; repetition_penalty None keeps the model's, 1.0 drops it
    gen = GenerationConfig(top_k=7, temperature=0.1, repetition_penalty=1.3)
    procs = build_processors(gen, DecodingConfig(temperature=1.0, seed=1), 4)
    assert names(procs) == ["RepetitionPenaltyLogitsProcessor"]
    assert names(build_processors(gen, DecodingConfig(repetition_penalty=1.0), 4)) == []


def test_warpers_only_when_sampling() -> None:
    # top-k / top-p set on a greedy request change nothing (as with generate(do_sample=False))
    assert names(build_processors(GenerationConfig(), DecodingConfig(top_k=3, top_p=0.5), 4)) == []


def test_eos_none_leaves_out_eos_processors() -> None:
    # generate adds min_new_tokens only when there is an EOS to hold back
    gen = GenerationConfig(min_new_tokens=3, eos_token_id=None)
    assert names(build_processors(gen, DecodingConfig(), 4)) == []


def test_unsupported_generation_config_is_refused() -> None:
    # guidance needs a second model pass per node: refused, never silently ignored
    with pytest.raises(UnsupportedGenerationConfig):
        build_processors(GenerationConfig(guidance_scale=2.0), DecodingConfig(), 4)


# ---- the chooser on hand-made logits ---------------------------------------------------------------
LOGITS = torch.tensor([  # [3, V]: rows = root, node 1 (token 1), node 2 (token 3, below node 1)
    [0.0, 5.0, 4.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0, 3.0, 2.9, 0.0],
    [0.0, 0.0, 0.0, 9.0, 0.0, 8.0],
])
PARENTS, TOKENS = [0, 1], [1, 3]


def test_plain_greedy_is_argmax_of_every_row() -> None:
    # no processors, no sampling: the raw argmax per node, whatever the tree
    assert chooser(DecodingConfig()).choose(LOGITS, [1, 2], PARENTS, TOKENS, 0) == [1, 3, 3]


def test_repetition_penalty_reads_each_nodes_own_context() -> None:
    # penalty 100 on the tokens of each node's own context (step context + path):
    # context [1]: the root avoids 1 (-> 2); node 2's path [1, 3] holds 3, so it avoids 3 (-> 5)
    c = chooser(DecodingConfig(repetition_penalty=100.0))
    assert c.choose(LOGITS, [1], PARENTS, TOKENS, 0) == [2, 3, 5]
    # context [3]: the root keeps 1, node 1 (context [3, 1]) avoids 3 (-> 4), node 2 avoids 3 again
    assert c.choose(LOGITS, [3], PARENTS, TOKENS, 0) == [1, 4, 5]


def test_no_repeat_ngram_per_node() -> None:
    # bigram ban: after context [5, 0, 5] the root may not repeat "5 0"; node 1 (token 3) may pick 0
    row = torch.tensor([9.0, 0.0, 0.0, 0.0, 0.0, 8.0])  # [V]: favours 0
    c = chooser(DecodingConfig(), GenerationConfig(no_repeat_ngram_size=2))
    assert c.choose(torch.stack([row, row]), [5, 0, 5], [0], [3], 0) == [5, 0]


def test_sampling_uses_the_noise_of_position_plus_depth() -> None:
    # node at depth d is argmax(logits / T + G(seed, position + d)): siblings share a position
    seed, pos, temp = 42, 10, 0.7
    flat = torch.zeros(4, 50)  # [4, 50]: uniform logits, so the noise alone decides
    c = chooser(DecodingConfig(temperature=temp, seed=seed))
    got = c.choose(flat, [1], [0, 1, 0], [7, 8, 9], pos)  # depths 0, 1, 2, 1
    want = [int((keyed_gumbel(seed, pos + d, 50)).argmax()) for d in (0, 1, 2, 1)]
    assert got == want
    assert got[1] == got[3]  # same depth, same (uniform) logits: same draw


def test_worked_example_positions() -> None:
    # the docstring's example: root at position 2, nodes 1 and 3 at 3, node 2 at 4
    seed = 9
    c = chooser(DecodingConfig(temperature=1.0, seed=seed))
    got = c.choose(torch.zeros(4, 30), [1, 2, 5, 9], [0, 1, 0], [7, 3, 4], 2)
    assert got == [int(keyed_gumbel(seed, p, 30).argmax()) for p in (2, 3, 4, 3)]


def test_top_k_removes_tokens_for_every_seed() -> None:
    # top-k 2 on the root row: only tokens 1 and 2 can ever be drawn, and both are
    drawn = {chooser(DecodingConfig(temperature=5.0, top_k=2, seed=s)).choose(LOGITS[:1], [0])[0] for s in range(200)}
    assert drawn == {1, 2}


def test_top_p_keeps_the_nucleus() -> None:
    # row [0, 0, 0, 9, 0, 8] at T=1: p(3) ~ 0.73, p(5) ~ 0.27; top-p 0.5 keeps token 3 alone, 0.9 both
    def drawn(top_p: float) -> set[int]:
        return {chooser(DecodingConfig(temperature=1.0, top_p=top_p, seed=s)).choose(LOGITS[2:], [0])[0]
                for s in range(100)}
    assert drawn(0.5) == {3}
    assert drawn(0.9) == {3, 5}


def test_chooser_refuses_a_tree_of_the_wrong_size() -> None:
    # 3 rows of logits need exactly 2 nodes: a mismatch is an error, not a silent misalignment
    with pytest.raises(ValueError):
        chooser(DecodingConfig(temperature=1.0, seed=1)).choose(LOGITS, [1], [0], [1], 0)


def test_chooser_leaves_the_callers_logits_alone() -> None:
    # processors may write in place: the caller's tensor must not change
    logits = LOGITS.clone()
    chooser(DecodingConfig(temperature=0.5, top_k=1, repetition_penalty=2.0, seed=3)).choose(logits, [1], PARENTS,
                                                                                             TOKENS, 0)
    assert torch.equal(logits, LOGITS)
