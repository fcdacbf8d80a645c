"""The Jacobi lookahead window in the decoding loop and the batched scheduler: exactly plain greedy.

Mode ``jacobi`` drafts from the branch's n-gram pool only; ``hierarchical`` with ``jacobi_window > 0``
merges the pool's n-grams with the trie's drafts. Either way every output must be token-for-token
``model.generate(do_sample=False)``'s, with EOS and without, on both attention kinds (eager adds the
float mask to the scores), whatever the window shape, alone or batched with other requests, on tiny
random models.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from lookahead_core import DecodingConfig, DraftMode
from lookahead_core.drafting.draft import DraftTree
from lookahead_core.drafting.jacobi import MAX_JACOBI_WINDOW, JacobiConfig
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig
from lookahead_core.forward.kernels import CostCurve
from lookahead_core.proposers.build import drafting_spec
from lookahead_core.proposers.jacobi import JacobiProposer, add_pool_drafts

from tests.core.helpers import FAMILIES, Client, StubTokenizer, eos_as, greedy, random_prompt, run_all, tiny_model
from tests.core.peek import proposer_of

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = 10  # random prompts per family, setup and attention kind
SHAPES = [(2, 2, 1), (4, 3, 2), (5, 4, 3), (3, 5, 4)]  # (W, N, G) drawn per prompt
SETUPS = {
    "jacobi": dict(mode=DraftMode.JACOBI),  # the pool alone
    "hierarchical+pool": dict(mode=DraftMode.HIERARCHICAL),  # merged with the trie's drafts
}


@pytest.mark.parametrize("fast", [True, False], ids=["packed", "stock"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("family", FAMILIES)
def test_jacobi_branch_equals_greedy(family: str, setup: str, attn: str, fast: bool) -> None:
    model = tiny_model(family, attn)
    emitted = steps = 0
    for idx in range(PROMPTS):
        rng = random.Random(7919 * idx + 3)
        prompt = random_prompt(rng)
        max_new = rng.randint(8, 40)
        eos = None if idx % 2 == 0 else rng.randrange(3, 256)  # half the runs have an EOS (banned from drafts)
        w, n, g = rng.choice(SHAPES)
        config = DecodingConfig(**SETUPS[setup], max_new_tokens=max_new, decoding_length=rng.choice([2, 8]),
                                jacobi_window=w, jacobi_ngram=n, jacobi_guesses=g)
        with eos_as(model, eos):
            expected = greedy(model, prompt, max_new)
            decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels="packed" if fast else "stock")
        res = decoder.generate(prompt)
        assert res.output_ids == expected, f"prompt {idx}, W={w} N={n} G={g}"
        assert 1 + sum(res.stats.accepted_per_step) == len(res.output_ids)
        emitted += len(res.output_ids) - 1
        steps += res.stats.forward_steps
    assert emitted > steps  # pool n-grams were accepted: multi-token steps were checked too


def test_jacobi_mode_drafts_only_from_the_pool() -> None:
    # a prompt the trie could copy from: mode jacobi still drafts nothing until the pool has n-grams
    model = tiny_model("llama")
    prompt = [5, 6, 7, 8] * 6
    config = DecodingConfig(mode=DraftMode.JACOBI, max_new_tokens=12, jacobi_window=3, jacobi_ngram=3)
    with eos_as(model, None):
        decoder = LookaheadDecoder(model, StubTokenizer(), config, kernels="stock")
        res = decoder.generate(prompt)
        assert res.output_ids == greedy(model, prompt, 12)
    assert res.stats.accepted_per_step[0] == 1  # step 1: the window is still filling, the pool is empty


def test_window_rows_keep_the_tree_and_window_apart() -> None:
    tree = DraftTree()
    tree.add_chain([11, 12], merge=True)  # q = 3 (root + 2)
    proposer = JacobiProposer([1, 2, 3], JacobiConfig(window=2, ngram=3, guesses=2))
    proposer.window = ((5, 6), (7, 8))  # L = 4
    got = proposer.extra(tree.parents, past=2)  # the cache holds 2 entries: every row sees them (pack.py)
    assert got.ids == [5, 6, 7, 8]
    assert got.positions == [3, 4, 4, 5]  # the window at past + l + j + 1 (the root sits at 2)
    assert got.keep == slice(2, 4)  # the last row's guesses are read
    assert got.visible.astype(int).tolist() == [
        # root  t1 t2 | (0,0) (0,1) (1,0) (1,1)
        [1, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0],  # tree node 1
        [1, 1, 1, 0, 0, 0, 0],  # tree node 2: never a window token
        [1, 0, 0, 1, 0, 0, 0],  # (0,0): the root, itself; no tree node
        [1, 0, 0, 1, 1, 0, 0],  # (0,1)
        [1, 0, 0, 1, 0, 1, 0],  # (1,0)
        [1, 0, 0, 1, 1, 0, 1],  # (1,1)
    ]


@pytest.mark.parametrize(("tails", "room", "limit", "banned", "chains"), [
    ([(1, 2, 3)], 5, 8, frozenset(), [[1, 2, 3]]),  # one continuation below the root
    ([(1, 2, 3), (1, 4)], 5, 8, frozenset(), [[1, 2, 3], [1, 4]]),  # a shared first token is merged
    ([(1, 2, 3)], 2, 8, frozenset(), [[1, 2]]),  # never deeper than the room left
    ([(1, 2, 3), (5, 6)], 5, 4, frozenset(), [[1, 2, 3], [5]]),  # at most `limit` nodes in the tree
    ([(1, 2, 3)], 5, 8, frozenset({2}), [[1]]),  # cut before a banned (EOS) token
    ([(2, 3)], 5, 8, frozenset({2}), []),  # nothing left: nothing added
])
def test_pool_drafts_join_the_tree(tails: list[tuple[int, ...]], room: int, limit: int, banned: frozenset[int],
                                   chains: list[list[int]]) -> None:
    tree = DraftTree()
    added = add_pool_drafts(tree, tails, room, limit, banned)
    expected = DraftTree()
    for chain in chains:
        expected.add_chain(chain, merge=True)
    assert (tree.tokens, tree.parents) == (expected.tokens, expected.parents)
    assert added == len(expected)


def test_observe_advances_the_window_and_pools_its_columns() -> None:
    proposer = JacobiProposer([1, 2, 3], JacobiConfig(window=2, ngram=3, guesses=2))
    proposer.window = ((5, 6), (7, 8))
    assert proposer.extra_tokens() == 4  # rows 0 and 1 of W=2 ride after the tree rows
    proposer.observe([9, 4])  # the last row (7, 8) predicted 9 and 4
    assert proposer.window == ((7, 8), (9, 4))
    assert proposer.pool.get(5) == [(7, 9)] and proposer.pool.get(6) == [(8, 4)]


# ---- in the batched scheduler -------------------------------------------------------------------


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_batched_jacobi_equals_greedy(family: str, adaptive: bool, scheduler_of) -> None:
    # 8 requests in one batch: jacobi, hierarchical+pool, plain hierarchical and none side by side, some
    # sampling-free neighbours with different window shapes; each equals its own greedy run
    model = tiny_model(family)
    rng = random.Random(23)
    sched = scheduler_of(model, SchedulerConfig(calibrate=adaptive, adaptive=adaptive, max_running=8,
                                                calibration_counts=(1, 8, 32), calibration_repeats=1))
    setups = [dict(mode=DraftMode.JACOBI), dict(mode=DraftMode.HIERARCHICAL),
              dict(mode=DraftMode.HIERARCHICAL, jacobi_window=0), dict(mode=DraftMode.NONE)]
    prompts = [random_prompt(rng) for _ in range(8)]
    with eos_as(model, None):
        clients = [Client() for _ in prompts]
        reqs = []
        for i, (prompt, client) in enumerate(zip(prompts, clients, strict=True)):
            w, n, g = SHAPES[i % len(SHAPES)]
            setup = {"jacobi_window": w, **setups[i % len(setups)]}
            config = DecodingConfig(**setup, max_new_tokens=12 + 3 * i, decoding_length=6, jacobi_ngram=n,
                                    jacobi_guesses=g)
            reqs.append(ServeRequest(prompt, config, on_tokens=client.on_tokens, on_done=client.on_done))
        run_all(sched, reqs, clients)
        for prompt, req, client in zip(prompts, reqs, clients, strict=True):
            assert client.error is None
            assert client.streamed == req.output == greedy(model, prompt, req.config.max_new_tokens)
    pools = [(r, p) for r in reqs if (p := proposer_of(r, JacobiProposer)) is not None]
    assert pools and all(r.config.mode is not DraftMode.NONE for r, _ in pools)
    assert sum(p.drafted for _, p in pools) > 0  # the pools really drafted in the batch


@pytest.mark.parametrize(("mode", "window", "cost", "want"), [
    (DraftMode.HIERARCHICAL, None, None, 0),  # no measured curve: no branch
    (DraftMode.JACOBI, None, None, 4),  # mode jacobi without a curve: DEFAULT_JACOBI_WINDOW
    (DraftMode.HIERARCHICAL, None, float, 0),  # cost(n) = n: the branch never pays
    (DraftMode.JACOBI, None, float, 1),  # ... but mode jacobi needs a window
    (DraftMode.HIERARCHICAL, None, lambda n: 1.0, MAX_JACOBI_WINDOW),  # free tokens: the widest
    (DraftMode.HIERARCHICAL, 3, float, 3),  # asked for: kept whatever the cost
    (DraftMode.LLMA, None, lambda n: 1.0, None),  # other modes take no branch: left alone
])
def test_the_spec_sizes_the_default_window_by_measured_cost(mode: DraftMode, window: int | None,
                                                         cost: Callable[[int], float] | None, want: int | None) -> None:
    got = drafting_spec(DecodingConfig(mode=mode, jacobi_window=window, decoding_length=8), cost)
    assert got.config.jacobi_window == want


def test_a_default_window_in_the_scheduler_follows_its_curve(scheduler_of) -> None:
    # the engine hands its measured cost to every request: a free-token curve opens the widest window
    model = tiny_model("llama")
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=2))
    kernels = sched.backend.kernels  # shared by every scheduler over this (cached) model: put its curve back
    before = kernels.curve
    kernels.curve = CostCurve((1, 64), {kernels.names[0]: (1.0, 1.0)})  # stands in for a measured, flat curve
    prompt = random_prompt(random.Random(3))
    try:
        with eos_as(model, None):
            client = Client()
            req = ServeRequest(prompt, DecodingConfig(max_new_tokens=12), on_tokens=client.on_tokens,
                               on_done=client.on_done)
            run_all(sched, [req], [client])
            assert client.error is None and req.output == greedy(model, prompt, 12)
    finally:
        kernels.curve = before
    assert req.config.jacobi_window == MAX_JACOBI_WINDOW and proposer_of(req, JacobiProposer) is not None
