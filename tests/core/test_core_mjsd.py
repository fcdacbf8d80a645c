"""Mode mjsd (lookahead_core.drafting.mjsd, mjsd_model): joint-likelihood acceptance on hand-made trees, the draft's
beam search, the opt-in and unverified flags, and the one case where MJSD must equal plain greedy."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.config import LOSSY_MODES
from lookahead_core.drafting.mjsd import cumulative, joint_accept, path_to
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.proposers.draft_model import early_exit
from lookahead_core.proposers.mjsd import MjsdProposer

from tests.core.helpers import (
    FAMILIES,
    Client,
    StubTokenizer,
    eos_as,
    greedy,
    random_prompt,
    run_all,
    serve_all_greedy,
    tiny_model,
)
from tests.core.peek import proposer_of

pytestmark = pytest.mark.usefixtures("one_thread")

LOG = math.log
TOL = 1e-4  # fp32 log-probs of a beam vs a fresh run


# (parents, draft log-probs, target log-probs, threshold, accepted path)
ACCEPT_CASES = [
    # the docstring's example: node 1 passes (gap -0.4), node 2 fails (gap -3.2 < log 0.1)
    ((0, 1), (-0.1, -0.2), (-0.5, -3.0), 0.1, [0, 1]),
    # the target likes the whole chain more than the draft did: all of it
    ((0, 1, 2), (-1.0, -1.0, -1.0), (-0.5, -0.5, -0.5), 0.1, [0, 1, 2, 3]),
    # the first token fails alone, but the two-token prefix passes: the longest passing prefix wins
    ((0, 1), (-0.1, -2.0), (-3.0, -0.1), 0.1, [0, 1, 2]),
    # nothing passes: the root only (the bonus token still comes from the target)
    ((0,), (-0.1,), (-5.0,), 0.1, [0]),
    # threshold 1: only prefixes at least as likely under the target; the deeper one is less likely
    ((0, 1), (-1.0, -1.0), (-1.0, -1.5), 1.0, [0, 1]),
    # two beams of equal depth pass: the higher target likelihood wins (node 4 over node 2)
    ((0, 1, 0, 3), (-0.5, -0.5, -0.5, -0.5), (-0.6, -0.9, -0.6, -0.7), 0.1, [0, 3, 4]),
    # a tie in depth and target likelihood: the earlier node (the better beam) keeps it
    ((0, 0), (-0.2, -0.3), (-0.4, -0.4), 0.1, [0, 1]),
    # a deeper node on the second beam beats a shallower one on the first
    ((0, 0, 2), (-0.1, -0.5, -0.5), (-0.1, -0.6, -0.6), 0.1, [0, 2, 3]),
    # an empty tree: the root
    ((), (), (), 0.1, [0]),
]


@pytest.mark.parametrize(("parents", "draft", "target", "threshold", "path"), ACCEPT_CASES)
def test_joint_accept(parents: tuple[int, ...], draft: tuple[float, ...], target: tuple[float, ...],
                      threshold: float, path: list[int]) -> None:
    assert joint_accept(parents, draft, target, threshold) == path


def test_joint_accept_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="threshold"):
        joint_accept((0,), (-1.0,), (-1.0,), 0.0)  # 0 would accept anything: not a threshold
    with pytest.raises(ValueError, match="one entry per node"):
        joint_accept((0, 1), (-1.0,), (-1.0, -1.0))


def test_cumulative_and_path_to() -> None:
    assert cumulative((0, 1, 0), (-1.0, -2.0, -0.5)) == [-1.0, -3.0, -0.5]  # node 2 sits under node 1
    assert path_to((0, 1, 0), 2) == [0, 1, 2]
    assert path_to((0, 1, 0), 3) == [0, 3]  # a child of the root
    with pytest.raises(ValueError, match="comes after"):
        cumulative((0, 2), (-1.0, -1.0))  # node 1's parent would be node 2


def fresh_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)  # [vocab]


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_scores_are_the_drafts_own_and_best_first(family: str) -> None:
    draft = early_exit(tiny_model(family), 1)
    context = [4, 8, 15, 16, 23, 42]
    proposer = MjsdProposer(draft, beams=3, depth=3, threshold=0.1)
    seqs, steps = proposer.beam_search(context, 3)
    assert len(seqs) == 3 and all(len(s) == 3 for s in seqs)
    totals = [sum(s) for s in steps]
    assert totals == sorted(totals, reverse=True)  # best beam first
    for seq, lps in zip(seqs, steps, strict=True):  # each token's log-prob is a fresh run's
        for i, token in enumerate(seq):
            want = fresh_logprobs(draft, context + seq[:i])[token].item()
            assert abs(lps[i] - want) < TOL
    one = MjsdProposer(draft, beams=1, depth=3, threshold=0.1).beam_search(context, 3)[0][0]
    chain, ctx = [], list(context)
    for _ in range(3):  # one beam is the draft's greedy chain
        chain.append(int(fresh_logprobs(draft, ctx).argmax()))
        ctx.append(chain[-1])
    assert one == chain


def test_propose_merges_beams_best_first_within_budget() -> None:
    draft = early_exit(tiny_model("llama"), 1)
    context = [4, 8, 15, 16, 23, 42]
    proposer = MjsdProposer(draft, beams=4, depth=3, threshold=0.1)
    seqs, _ = proposer.beam_search(context, 3)
    tree = proposer.propose(context, budget=100, max_depth=3)
    assert sorted(tree.paths()) == sorted(seqs)  # every beam, once (beams are distinct sequences)
    assert tree.tokens[:3] == seqs[0]  # the best beam is the first chain
    assert len(proposer.node_logprobs) == len(tree)
    small = proposer.propose(context, budget=2, max_depth=3)
    assert len(small) == 2 and small.tokens == seqs[0][:2]  # the budget keeps the best beam's prefix
    banned = proposer.propose(context, budget=100, max_depth=1, banned=frozenset({seqs[0][0]}))
    assert seqs[0][0] not in banned.tokens  # an EOS is never drafted


def test_mjsd_is_opt_in_and_greedy_only() -> None:
    assert not DecodingConfig().lossy  # the default mode is lossless
    assert {DraftMode.MJSD} == LOSSY_MODES  # the one lossy mode
    assert DecodingConfig(mode="mjsd").lossy  # only by name
    with pytest.raises(ValueError, match="greedy only"):
        DecodingConfig(mode="mjsd", temperature=0.7)
    with pytest.raises(ValueError, match="mjsd_threshold"):
        DecodingConfig(mode="mjsd", mjsd_threshold=1.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_mjsd_with_the_target_as_its_own_one_beam_draft_is_plain_greedy(family: str) -> None:
    # draft = every layer of the target and one beam: the beam is greedy's own chain and every prefix's
    # ratio is 1, so everything passes: the one case where MJSD must give exactly greedy's tokens
    model = tiny_model(family)
    layers = model.config.num_hidden_layers
    for idx in range(4):
        rng = random.Random(17 * idx + 3)
        prompt = random_prompt(rng)
        max_new = rng.randint(8, 24)
        config = DecodingConfig(mode="mjsd", max_new_tokens=max_new, decoding_length=8, draft_layers=layers,
                                draft_depth=3, mjsd_beams=1)
        with eos_as(model, None):
            expected = greedy(model, prompt, max_new)
            res = LookaheadDecoder(model, StubTokenizer(), config, kernels="stock").generate(prompt)
        assert res.output_ids == expected, f"prompt {idx}"
        assert res.stats.unverified  # the stats flag it whatever the output
        assert max(res.stats.accepted_per_step) == 4  # three drafted tokens and the bonus, all accepted


def test_mjsd_accepts_whole_beams_at_a_permissive_threshold() -> None:
    # a threshold near 0 accepts the best beam whole every step: each step emits depth + 1 tokens,
    # and the run differs from greedy somewhere (a one-layer draft is another model)
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(5))
    config = DecodingConfig(mode="mjsd", max_new_tokens=25, decoding_length=8, draft_layers=1, draft_depth=4,
                            mjsd_beams=2, mjsd_threshold=1e-30)
    with eos_as(model, None):
        res = LookaheadDecoder(model, StubTokenizer(), config, kernels="stock").generate(prompt)
        plain = greedy(model, prompt, 25)
    assert res.stats.accepted_per_step == [5] * 4 + [4]  # 1 (prefill) + 4 x 5 + 4 = 25
    assert res.output_ids != plain
    strict = replace(config, mjsd_threshold=1.0)
    with eos_as(model, None):
        fewer = LookaheadDecoder(model, StubTokenizer(), strict, kernels="stock").generate(prompt)
    assert fewer.stats.forward_steps > res.stats.forward_steps  # a strict threshold accepts less


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_mjsd_rides_with_lossless_requests(family: str, scheduler_of) -> None:
    # batched: mjsd requests (target as its one-beam draft: greedy's tokens) beside hierarchical ones
    model = tiny_model(family)
    layers = model.config.num_hidden_layers
    rng = random.Random(43)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=4))
    prompts = [random_prompt(rng) for _ in range(4)]
    modes = [DraftMode.MJSD, DraftMode.HIERARCHICAL]
    configs = [DecodingConfig(mode=modes[i % 2], max_new_tokens=10 + 3 * i, decoding_length=6, draft_layers=layers,
                              draft_depth=3, mjsd_beams=1) for i in range(len(prompts))]
    with eos_as(model, None):
        reqs = serve_all_greedy(sched, model, prompts, configs)
    assert [r.stats.unverified for r in reqs] == [True, False, True, False]
    beams = [p for r in reqs if (p := proposer_of(r, MjsdProposer)) is not None]
    assert len(beams) == 2 and all(p.forwards > 0 for p in beams)  # the beams really ran


def test_batched_mjsd_judges_by_joint_likelihood(scheduler_of) -> None:
    # the scheduler must use the joint acceptance, not greedy matching: at a permissive threshold every
    # step takes the best beam whole, the same tokens the one-request loop gives
    model = tiny_model("llama")
    config = DecodingConfig(mode="mjsd", max_new_tokens=21, decoding_length=8, draft_layers=1, draft_depth=4,
                            mjsd_beams=2, mjsd_threshold=1e-30)
    prompt = random_prompt(random.Random(9))
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=2))
    with eos_as(model, None):
        alone = LookaheadDecoder(model, StubTokenizer(), config, kernels="stock").generate(prompt)
        client = Client()
        req = ServeRequest(prompt, config, on_tokens=client.on_tokens, on_done=client.on_done)
        run_all(sched, [req], [client])
    assert client.error is None
    assert req.stats.accepted_per_step == [5] * 4  # 1 (prefill) + 4 x 5 = 21
    assert req.output == alone.output_ids
