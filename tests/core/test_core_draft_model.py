"""Mode draft-model (lookahead_core.proposers.draft_model): the self-draft, the draft's KV rollback, its token trees,
and exact greedy equality alone and batched, on tiny random models."""

from __future__ import annotations

import random

import pytest
import torch
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.drafting.draft import DraftTree
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.proposers.draft_model import DraftModelProposer, DraftModels, early_exit, trie_is_weak

from tests.core.helpers import FAMILIES, StubTokenizer, eos_as, greedy, random_prompt, serve_all_greedy, tiny_model
from tests.core.peek import proposer_of

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4  # fp32 logits of a rolled-back cache vs a fresh run
PROMPTS = 8  # random prompts per family and draft


def logits_of(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]  # [vocab]


@pytest.mark.parametrize("family", FAMILIES)
def test_early_exit_shares_the_targets_weights_and_leaves_it_whole(family: str) -> None:
    target = tiny_model(family)
    ids = [5, 9, 14, 3, 7]
    before = logits_of(target, ids)
    layers = target.config.num_hidden_layers
    full = early_exit(target, layers)
    assert torch.allclose(logits_of(full, ids), before, atol=TOL)  # all layers: the target itself
    short = early_exit(target, 1)
    assert not torch.allclose(logits_of(short, ids), before, atol=TOL)  # one layer: another model
    assert short.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()  # shared, not copied
    assert len(target.model.layers) == layers and target.config.num_hidden_layers == layers  # untouched
    assert torch.allclose(logits_of(target, ids), before, atol=0)


def test_early_exit_refuses_impossible_depths() -> None:
    target = tiny_model("llama")
    for bad in (0, target.config.num_hidden_layers + 1):
        with pytest.raises(ValueError, match="early exit"):
            early_exit(target, bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_rolled_back_cache_gives_a_fresh_runs_logits(family: str) -> None:
    draft = early_exit(tiny_model(family), 1)
    proposer = DraftModelProposer(draft, top_k=2, depth=3)
    context = [4, 8, 15, 16, 23, 42]
    proposer.propose(context, budget=6, max_depth=3)  # the cache now also holds a chain of guesses
    accepted = [*context, 7, 11]  # the target accepted other tokens than the chain's
    assert torch.allclose(proposer.sync(accepted), logits_of(draft, accepted), atol=TOL)
    shorter = context[:4]  # a context the cache overshoots entirely (a new request's prompt, say)
    assert torch.allclose(proposer.sync(shorter), logits_of(draft, shorter), atol=TOL)
    assert proposer.seen == shorter


def test_propose_expands_top_k_per_depth_within_budget_and_depth() -> None:
    draft = early_exit(tiny_model("llama"), 1)
    context = [4, 8, 15, 16, 23, 42]
    first = logits_of(draft, context).topk(3).indices.tolist()
    tree = DraftModelProposer(draft, top_k=3, depth=4).propose(context, budget=100, max_depth=2)
    assert tree.tokens[:3] == first and tree.parents[:3] == [0, 0, 0]  # depth 1: the draft's top 3
    assert max(tree.depths) == 2 and len(tree) == 6  # depth 2 below the top-1 child only; max_depth wins
    small = DraftModelProposer(draft, top_k=3, depth=4).propose(context, budget=4, max_depth=4)
    assert len(small) == 4  # budget wins
    banned = DraftModelProposer(draft, top_k=3, depth=1).propose(context, 10, 1, banned=frozenset(first[:1]))
    assert first[0] not in banned.tokens  # an EOS is never drafted


@pytest.mark.parametrize(("base", "extra", "tokens", "parents"), [
    ([[1, 2]], [[1, 3]], [1, 2, 3], [0, 1, 1]),  # a shared first token is merged
    ([], [[4, 5]], [4, 5], [0, 1]),  # into an empty tree
    ([[1]], [[1]], [1], [0]),  # nothing new
])
def test_merge_adds_only_new_nodes(base: list[list[int]], extra: list[list[int]], tokens: list[int],
                                        parents: list[int]) -> None:
    tree, more = DraftTree(), DraftTree()
    for chain in base:
        tree.add_chain(chain, merge=True)
    for chain in extra:
        more.add_chain(chain, merge=True)
    tree.merge(more)
    assert (tree.tokens, tree.parents) == (tokens, parents)


def test_a_draft_with_another_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        DraftModels(tiny_model("llama"), tiny_model("llama", vocab=64))


@pytest.mark.parametrize("draft", ["self", "tiny"])
@pytest.mark.parametrize("fast", [True, False], ids=["packed", "stock"])
@pytest.mark.parametrize("family", FAMILIES)
def test_draft_model_mode_equals_greedy(family: str, fast: bool, draft: str) -> None:
    # self: the target's first layer; tiny: another random model with the same vocabulary
    model = tiny_model(family)
    given = tiny_model(family, seed=1) if draft == "tiny" else None
    proposed = 0
    for idx in range(PROMPTS):
        rng = random.Random(31 * idx + 5)
        prompt = random_prompt(rng)
        max_new = rng.randint(8, 32)
        eos = None if idx % 2 == 0 else rng.randrange(3, 256)
        config = DecodingConfig(mode=DraftMode.DRAFT_MODEL, max_new_tokens=max_new, decoding_length=8,
                                draft_layers=1, draft_top_k=rng.choice([1, 2, 3]), draft_depth=rng.choice([1, 3]))
        with eos_as(model, eos):
            expected = greedy(model, prompt, max_new)
            decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels="packed" if fast else "stock",
                                       draft_model=given)
        res = decoder.generate(prompt)
        assert res.output_ids == expected, f"prompt {idx}"
        proposed += res.stats.draft_tokens
    assert proposed > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_draft_model_equals_greedy(family: str, scheduler_of) -> None:
    model = tiny_model(family)
    rng = random.Random(41)
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=6))
    modes = [DraftMode.DRAFT_MODEL, DraftMode.HIERARCHICAL, DraftMode.DRAFT_MODEL, DraftMode.NONE]
    prompts = [random_prompt(rng) for _ in range(6)]
    configs = [DecodingConfig(mode=modes[i % 4], max_new_tokens=10 + 3 * i, decoding_length=6, draft_layers=1,
                              draft_depth=3) for i in range(len(prompts))]
    with eos_as(model, None):
        reqs = serve_all_greedy(sched, model, prompts, configs)
    drafted = [r for r in reqs if r.config.mode is DraftMode.DRAFT_MODEL]
    # the drafts really ran
    assert all((p := proposer_of(r, DraftModelProposer)) is not None and p.forwards > 0 for r in drafted)


def test_the_targets_forward_hooks_do_not_fire_for_the_self_draft() -> None:
    # a hook on the target (a benchmark's forward counter) must count the target's calls only
    target = tiny_model("llama")
    calls: list[str] = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append("target"))
    try:
        draft = early_exit(target, 1)
        logits_of(draft, [5, 9, 14])
        assert calls == []  # the draft ran without the target's hook
        logits_of(target, [5, 9, 14])
        assert calls == ["target"]  # and the target's hook still works
    finally:
        handle.remove()


@pytest.mark.parametrize(("chains", "budget", "want"), [
    ([[1, 2, 3, 4, 5]], 8, False),  # a 5-deep trie chain (a copy in progress): the draft is not asked
    ([[1], [2], [3]], 8, True),  # three shallow branches and room left: the draft fills in
    ([[1, 2], [3, 4], [5, 6], [7, 8]], 8, False),  # the budget is full
    ([], 8, True),  # no trie drafts at all (a cold question)
    ([[1, 2, 3]], 8, True),  # 3 deep, under the draft's 4
])
def test_the_draft_is_asked_only_where_the_trie_is_weak(chains: list[list[int]], budget: int, want: bool) -> None:
    tree = DraftTree()
    for chain in chains:
        tree.add_chain(chain, merge=True)
    assert trie_is_weak(tree, budget, depth=4) is want
