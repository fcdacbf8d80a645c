"""Exact greedy equality on tiny random models (llama, qwen2): random prompts and adversarial drafts.

Every LookaheadDecoder output must be token-for-token ``model.generate(do_sample=False)``'s, whatever
the drafts: from the trie (every mode), all wrong, all right, forking, duplicated, containing EOS.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from lookahead_core import DecodingConfig, DraftMode, PathRecorder
from lookahead_core.engine.decoder import GenerationResult, LookaheadDecoder
from transformers import PreTrainedModel

from tests.core.helpers import (
    FAMILIES,
    MODES,
    StubTokenizer,
    draft_cap,
    duplicate_chains_drafter,
    eos_as,
    eos_drafter,
    forking_drafter,
    greedy,
    oracle_drafter,
    random_prompt,
    tiny_model,
    wrong_drafter,
)

pytestmark = pytest.mark.usefixtures("one_thread")

N_PROMPTS = {"sdpa": 30, "eager": 10}  # random prompts per family and attention kind
BUDGET = 16  # decoding length of the adversarial runs


@dataclass(frozen=True)
class Case:
    """One random prompt with its settings and its greedy references."""

    idx: int
    prompt: list[int]
    max_new: int
    decoding_length: int
    eos: int | None  # EOS for this run (None: fixed length)
    free: list[int]  # greedy output with no EOS (runs past where ``eos`` would stop it)
    expected: list[int]  # greedy output with ``eos``


@functools.cache
def cases(family: str, attn: str) -> tuple[Case, ...]:
    """Random prompts, a third with no EOS, a third with an EOS greedy emits, a third with a random EOS."""
    model = tiny_model(family, attn)
    out = []
    for idx in range(N_PROMPTS[attn]):
        rng = random.Random(1000 * idx + 7)
        prompt = random_prompt(rng)
        max_new = rng.randint(6, 40)
        with eos_as(model, None):
            free = greedy(model, prompt, max_new)
        if idx % 3 == 0:
            eos = None
        elif idx % 3 == 1:
            eos = free[rng.randint(1, len(free) - 1)]  # a token greedy emits: the run stops early
        else:
            eos = rng.randrange(3, 256)  # usually never emitted, but still banned from drafts
        with eos_as(model, eos):
            expected = greedy(model, prompt, max_new) if eos is not None else free
        length = rng.choice([1, 2, 4, 8, 16])
        out.append(Case(idx, prompt, max_new, length, eos, free, expected))
    return tuple(out)


def run(
    model: PreTrainedModel, case: Case, config: DecodingConfig, fast: bool, **kwargs: object
) -> GenerationResult:
    with eos_as(model, case.eos):  # the decoder reads the model's EOS when it is built
        decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels="packed" if fast else "stock")
    return decoder.generate(case.prompt, **kwargs)


def check_stats(res: GenerationResult, case: Case, config: DecodingConfig) -> None:
    """Bookkeeping every run must satisfy."""
    out, stats = res.output_ids, res.stats
    assert len(out) <= case.max_new
    assert stats.new_tokens == len(out)
    assert stats.forward_steps == len(stats.accepted_per_step)
    assert 1 + sum(stats.accepted_per_step) == len(out)  # the first token comes from the prefill
    assert stats.draft_tokens <= stats.forward_steps * draft_cap(config, config.decoding_length)
    if case.eos is not None and out[-1] == case.eos:
        assert stats.finish_reason == "eos"
        assert case.eos not in out[:-1]
    else:
        assert stats.finish_reason == "length" and len(out) == case.max_new
    assert res.text == StubTokenizer().decode(out)


@pytest.mark.parametrize("fast", [True, False], ids=["packed", "stock"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])  # eager adds the float mask to the scores
@pytest.mark.parametrize("family", FAMILIES)
def test_random_prompts_equal_greedy(family: str, attn: str, mode: str, fast: bool) -> None:
    model = tiny_model(family, attn)
    emitted = steps = 0
    for case in cases(family, attn):
        config = DecodingConfig(
            mode=DraftMode(mode), max_new_tokens=case.max_new, decoding_length=case.decoding_length
        )
        res = run(model, case, config, fast)
        assert res.output_ids == case.expected, f"prompt {case.idx}"
        check_stats(res, case, config)
        if mode == "none":
            assert res.stats.draft_tokens == 0 and set(res.stats.accepted_per_step) <= {1}
        emitted += len(res.output_ids) - 1
        steps += res.stats.forward_steps
    if mode != "none":  # drafts really were accepted, so multi-token steps were checked too
        assert emitted / steps > 1.2


@pytest.mark.parametrize("mode", ["hierarchical", "parallel", "llma"])
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_holding_the_answer_is_accepted(family: str, mode: str) -> None:
    """A retrieved reference that contains the answer: equal to greedy, and long runs get accepted."""
    model = tiny_model(family)
    emitted = steps = 0
    for case in cases(family, "sdpa")[:9]:
        config = DecodingConfig(mode=DraftMode(mode), max_new_tokens=case.max_new)
        res = run(model, case, config, True, references=[case.prompt[-8:] + case.expected])
        assert res.output_ids == case.expected, f"prompt {case.idx}"
        check_stats(res, case, config)
        emitted += len(res.output_ids) - 1
        steps += res.stats.forward_steps
    assert emitted / steps > 2.5


# ---- adversarial drafts ------------------------------------------------------------------------------
def fixed_length_cases(family: str) -> list[Case]:
    return [c for c in cases(family, "sdpa") if c.eos is None][:8]


def non_contiguous(paths: Sequence[tuple[int, ...]]) -> int:
    """Steps whose accepted nodes (flattened indices, root excluded) are not the tree's first nodes."""
    return sum(1 for p in paths if p != tuple(range(1, len(p) + 1)))


DrafterFactory = Callable[[int, Sequence[int]], Callable[..., object]]
# name -> (factory(prompt_len, truth), tokens a full step emits, or None when not fixed)
ADVERSARIES: dict[str, tuple[DrafterFactory, int, bool]] = {
    # all wrong: one token per step (the model's own)
    "wrong": (wrong_drafter, 1, False),
    # oracle: the whole budget is accepted every step, plus the bonus token
    "oracle": (oracle_drafter, BUDGET + 1, False),
    # a wrong sibling first at every depth: 5 levels of 3 nodes fit the budget, the path skips nodes
    "forking": (forking_drafter, BUDGET // 3 + 1, True),
    # the right chain duplicated after a copy that goes wrong: the path skips the first copy
    "duplicates": (duplicate_chains_drafter, BUDGET // 2 + 1, True),
}


@pytest.mark.parametrize("fast", [True, False], ids=["packed", "stock"])
@pytest.mark.parametrize("kind", list(ADVERSARIES))
@pytest.mark.parametrize("family", FAMILIES)
def test_adversarial_drafts_equal_greedy(family: str, kind: str, fast: bool) -> None:
    factory, per_step, gapped = ADVERSARIES[kind]
    recorder = PathRecorder()  # the accepted path of every step of every case
    model = tiny_model(family)
    for case in fixed_length_cases(family):
        config = DecodingConfig(max_new_tokens=case.max_new, decoding_length=BUDGET)
        drafter = factory(len(case.prompt), case.expected)
        res = run(model, case, config, fast, drafter=drafter, observer=recorder)
        assert res.output_ids == case.expected, f"prompt {case.idx}"
        check_stats(res, case, config)
        # every step but the last emits exactly what a full step of this drafter gives
        assert res.stats.forward_steps == math.ceil((case.max_new - 1) / per_step), f"prompt {case.idx}"
    if kind == "oracle":
        assert res.stats.mean_accepted_per_step > 4
    if gapped:  # the accepted KV entries really were scattered in the flattened tree
        assert non_contiguous(recorder.paths) >= len(fixed_length_cases(family))


@pytest.mark.parametrize("fast", [True, False], ids=["packed", "stock"])
@pytest.mark.parametrize("family", FAMILIES)
def test_drafts_containing_eos_equal_greedy(family: str, fast: bool) -> None:
    """The oracle branch runs past EOS and a second branch holds EOS at a wrong place: stop at EOS."""
    model = tiny_model(family)
    eos_cases = [c for c in cases(family, "sdpa") if c.eos is not None and c.eos in c.free]
    assert len(eos_cases) >= 5
    for case in eos_cases:
        assert case.eos is not None
        config = DecodingConfig(max_new_tokens=case.max_new, decoding_length=BUDGET)
        res = run(model, case, config, fast, drafter=eos_drafter(len(case.prompt), case.free, case.eos))
        assert res.output_ids == case.expected, f"prompt {case.idx}"
        assert res.stats.finish_reason == "eos"
        check_stats(res, case, config)


@pytest.mark.parametrize("family", FAMILIES)
def test_drafter_is_never_asked_past_max_new_tokens(family: str) -> None:
    model = tiny_model(family)
    case = fixed_length_cases(family)[0]
    asked: list[tuple[int, int, int]] = []
    oracle = oracle_drafter(len(case.prompt), case.expected)

    def spy(context: list[int], budget: int, max_depth: int) -> object:
        asked.append((len(context) - len(case.prompt), budget, max_depth))
        return oracle(context, budget, max_depth)

    config = DecodingConfig(max_new_tokens=case.max_new, decoding_length=BUDGET)
    res = run(model, case, config, True, drafter=spy)
    assert res.output_ids == case.expected
    assert asked
    for emitted, budget, max_depth in asked:
        assert budget == BUDGET
        assert emitted + max_depth + 1 == case.max_new  # a step emits at most max_depth + 1 tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_drafter_overshooting_max_depth_is_cut(family: str) -> None:
    """A drafter that ignores max_depth (drafts the whole truth and beyond) still stops at max_new_tokens."""
    model = tiny_model(family)
    case = fixed_length_cases(family)[1]
    long_truth = case.expected + [5] * 50

    def greedy_past_limit(context: list[int], budget: int, max_depth: int) -> object:
        return oracle_drafter(len(case.prompt), long_truth)(context, budget, 10**6)

    config = DecodingConfig(max_new_tokens=case.max_new, decoding_length=BUDGET)
    res = run(model, case, config, True, drafter=greedy_past_limit)
    assert res.output_ids == case.expected
    assert res.stats.finish_reason == "length"
