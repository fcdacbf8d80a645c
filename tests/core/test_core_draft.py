"""Draft retrieval (retrieve_draft, DraftTree): modes, budget, depth, banned tokens, multi-stage match."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lookahead_core.config import DecodingConfig, DraftMode, TrieConfig
from lookahead_core.drafting.draft import DraftTree, within_vocab
from lookahead_core.drafting.trie import TokenTrie
from lookahead_core.proposers.build import drafting_spec
from lookahead_core.proposers.trie import retrieve_draft

from tests.core.helpers import check_tree_shape, draft_cap, node_paths
from tests.core.peek import contains_path

ALL_MODES = list(DraftMode)  # every mode, plain greedy (none) included
DRAFTING_MODES = [DraftMode.HIERARCHICAL, DraftMode.PARALLEL, DraftMode.LLMA]  # the modes that draft at all


def retrieve(trie: TokenTrie, context: list[int], config: DecodingConfig, budget: int, max_depth: int,
             banned: frozenset[int] = frozenset()) -> DraftTree:
    """What the trie drafts for ``config``'s mode: the shape is the one ``drafting_spec`` picks (none: no trie)."""
    shape = drafting_spec(config).trie
    if shape is None:
        return DraftTree()
    return retrieve_draft(trie, context, config, budget, max_depth, banned, shape=shape)


def cfg(mode: DraftMode, **kw: object) -> DecodingConfig:
    return DecodingConfig(mode=mode, trie=TrieConfig(branch_length=kw.pop("branch_length", 6)), **kw)  # type: ignore[arg-type]


def trie_of(prompts: list[list[int]] = (), outputs: list[list[int]] = (), length: int = 6) -> TokenTrie:  # type: ignore[assignment]
    trie = TokenTrie(TrieConfig(branch_length=length))
    for i, p in enumerate(prompts):
        trie.insert_prompt(p, owner=f"o{i}")
    for out in outputs:
        trie.insert_output(out)
    return trie


# ---- DraftTree ------------------------------------------------------------------------------------
def test_draft_tree_add_merges_and_tracks_depth() -> None:
    tree = DraftTree()
    tree.add_chain([1, 2, 3], merge=True)
    tree.add_chain([1, 2, 4], merge=True)  # shares the prefix 1, 2
    tree.add_chain([1, 2], merge=False)  # a separate copy
    assert tree.tokens == [1, 2, 3, 4, 1, 2]
    assert tree.parents == [0, 1, 2, 2, 0, 5]
    assert tree.depths == [1, 2, 3, 3, 1, 2]
    assert tree.depth() == 3
    assert sorted(tree.paths()) == [[1, 2], [1, 2, 3], [1, 2, 4]]
    check_tree_shape(tree)
    assert DraftTree().depth() == 0 and DraftTree().paths() == []


# ---- modes on one trie: table-driven -------------------------------------------------------------
# The trie: prompt "1 2 3 4 5" and "1 2 3 7 8", output "1 2 9" three times. After context [.., 1, 2]:
# continuations 3 (prompt, weight 200) -> 4 5 | 7 8, and 9 (output, weight 3).
PROMPTS = [[1, 2, 3, 4, 5], [1, 2, 3, 7, 8]]
OUTPUTS = [[1, 2, 9]] * 3
MODE_CASES: list[tuple[DraftMode, int, int, list[list[int]], int]] = [
    # hierarchical: one merged tree, every continuation fits the budget
    (DraftMode.HIERARCHICAL, 16, 8, [[3, 4, 5], [3, 7, 8], [9]], 6),
    # hierarchical, budget 4: the 4 most probable nodes: 3, then 4 and 7 (0.49 each), then 5 (0.49, queued
    # before 8); 9 (3/203) misses out
    (DraftMode.HIERARCHICAL, 4, 8, [[3, 4, 5], [3, 7]], 4),
    # hierarchical, max_depth 1: only the first tokens
    (DraftMode.HIERARCHICAL, 16, 1, [[3], [9]], 2),
    # parallel: separate chains, the shared prefix 3 is duplicated
    (DraftMode.PARALLEL, 16, 8, [[3, 4, 5], [3, 7, 8], [9]], 7),
    # parallel, budget 4: the best chain, then the next one cut to the remaining budget
    (DraftMode.PARALLEL, 4, 8, [[3, 4, 5], [3]], 4),
    # llma: only the single best chain
    (DraftMode.LLMA, 16, 8, [[3, 4, 5]], 3),
    # llma, max_depth 2: the best chain cut at the depth limit
    (DraftMode.LLMA, 16, 2, [[3, 4]], 2),
    # none: plain greedy, never a draft
    (DraftMode.NONE, 16, 8, [], 0),
]


@pytest.mark.parametrize(("mode", "budget", "max_depth", "paths", "size"), MODE_CASES)
def test_modes(mode: DraftMode, budget: int, max_depth: int, paths: list[list[int]], size: int) -> None:
    trie = trie_of(PROMPTS, OUTPUTS)
    # min_fill 0: one stage only (the shorter suffix [2] has the same continuations; see multi-stage below)
    tree = retrieve(trie, [6, 1, 2], cfg(mode, min_fill=0.0), budget=budget, max_depth=max_depth)
    check_tree_shape(tree)
    assert sorted(tree.paths()) == sorted(paths)
    assert len(tree) == size


def test_parallel_does_not_repeat_identical_chains() -> None:
    trie = trie_of(PROMPTS, OUTPUTS)
    tree = retrieve(trie, [6, 1, 2], cfg(DraftMode.PARALLEL), budget=16, max_depth=8)
    paths = [tuple(p) for p in tree.paths()]
    assert len(paths) == len(set(paths)), paths


def test_llma_is_a_single_chain() -> None:
    trie = trie_of([[1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [2, 9]], [[2, 3, 3]])
    tree = retrieve(trie, [1, 2], cfg(DraftMode.LLMA), budget=16, max_depth=16)
    assert len(tree) >= 2
    assert tree.parents == list(range(len(tree)))  # every node's parent is the previous node


def test_parallel_chains_are_not_merged() -> None:
    trie = trie_of([[5, 1, 2, 3], [5, 1, 2, 4]])
    tree = retrieve(trie, [5], cfg(DraftMode.PARALLEL), budget=16, max_depth=8)
    assert sorted(tree.paths()) == [[1, 2, 3], [1, 2, 4]]
    assert tree.parents.count(0) == 2  # two chains start at the root: the prefix 1 2 is not shared
    merged = retrieve(trie, [5], cfg(DraftMode.HIERARCHICAL), budget=16, max_depth=8)
    assert merged.parents.count(0) == 1 and len(merged) == 4  # the tree shares it


def test_hierarchical_prefers_prompt_weight() -> None:
    trie = trie_of([[1, 5]], [[1, 6]] * 3)  # prompt continuation 5 (once), output continuation 6 (3x)
    assert retrieve(trie, [1], cfg(DraftMode.HIERARCHICAL), budget=1, max_depth=4).tokens == [5]
    light = DecodingConfig(trie=TrieConfig(branch_length=6, prompt_weight=1.0))
    assert retrieve(trie, [1], light, budget=1, max_depth=4).tokens == [6]


# (context, budget, expected size): a 20-token prompt copied verbatim, every continuation has probability 1
EXTEND_CASES: list[tuple[list[int], int, int]] = [
    # a 5-token match (>= extend_min_match): confident nodes extend past the budget to the prompt's end
    ([10, 11, 12, 13, 14], 4, 15),
    # the same match with a budget already past the extension cap: the budget rules
    ([10, 11, 12, 13, 14], 40, 15),
    # a 1-token context: match too short to extend, the budget caps the tree
    ([14], 4, 4),
    # a 3-token match (< extend_min_match 4): still capped by the budget
    ([12, 13, 14], 4, 4),
]


@pytest.mark.parametrize(("context", "budget", "size"), EXTEND_CASES)
def test_hierarchical_extends_only_below_a_long_confident_match(context: list[int], budget: int, size: int) -> None:
    prompt = list(range(10, 30))
    config = DecodingConfig(trie=TrieConfig(branch_length=32), max_decoding_length=32, extend_min_match=4)
    tree = retrieve(trie_of([prompt], length=32), context, config, budget=budget, max_depth=64)
    assert len(tree) == size
    start = prompt.index(context[-1]) + 1
    assert tree.paths() == [prompt[start : start + size]]  # one chain: the copy continues


def test_extension_needs_confident_nodes() -> None:
    # after the 5-token match the trie forks 50/50: below the 0.9 confidence the budget caps the tree
    trie = trie_of([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 16, 17, 18, 19]], length=32)
    config = DecodingConfig(trie=TrieConfig(branch_length=32), max_decoding_length=32, extend_min_prob=0.9)
    assert len(retrieve(trie, [1, 2, 3, 4, 5], config, budget=3, max_depth=64)) == 3


# (outputs, prompts, chain_to, expected chain after context [1..5]): 6-token trie windows, so a branch
# under a 5-token match is one token deep; past outputs carry the chain further
CHAIN_CASES: list[tuple[list[list[int]], list[list[int]], int, list[int]]] = [
    # a past answer 1..30: the chain follows it to chain_to nodes (6..25), far past the trie's depth
    ([list(range(1, 31))], [], 20, list(range(6, 26))),
    # chain_to 0: the config's max_decoding_length (8) caps the copy
    ([list(range(1, 31))], [], 0, list(range(6, 14))),
    # the answer ends: the chain ends with it
    ([list(range(1, 12))], [], 20, list(range(6, 12))),
    # two past answers fork after 8 (50/50, under extend_min_prob): the chain stops at the fork
    ([[*range(1, 9), 50, 51, 52], [*range(1, 9), 60, 61, 62]], [], 20, [6, 7, 8]),
    # the same text only in a prompt: no output evidence, no chain past the trie's depth
    ([], [list(range(1, 31))], 20, [6]),
]


@pytest.mark.parametrize(("outputs", "prompts", "chain_to", "chain"), CHAIN_CASES)
def test_a_past_answer_continues_as_one_chain(outputs: list[list[int]], prompts: list[list[int]], chain_to: int,
                                              chain: list[int]) -> None:
    config = DecodingConfig(trie=TrieConfig(branch_length=6), max_decoding_length=8, extend_min_match=4, min_fill=0)
    tree = retrieve_draft(trie_of(prompts, outputs), [1, 2, 3, 4, 5], config, budget=1, max_depth=64,
                          chain_to=chain_to)
    assert tree.paths() == [chain]


def test_a_chain_stops_at_max_depth() -> None:
    # a step never emits past max_new_tokens: the chain is as deep as the room allows
    config = DecodingConfig(trie=TrieConfig(branch_length=6), max_decoding_length=8, min_fill=0)
    tree = retrieve_draft(trie_of([], [list(range(1, 31))]), [1, 2, 3, 4, 5], config, budget=1, max_depth=12,
                          chain_to=40)
    assert tree.paths() == [list(range(6, 18))]


# ---- banned tokens -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", DRAFTING_MODES)
def test_banned_tokens_never_drafted(mode: DraftMode) -> None:
    eos = 0
    trie = trie_of([[1, 2, 0, 3], [1, 2, 4, 0, 5], [1, 0, 0]])
    tree = retrieve(trie, [1], cfg(mode), budget=16, max_depth=8, banned=frozenset({eos}))
    assert len(tree) > 0
    assert eos not in tree.tokens
    for path in tree.paths():  # a branch stops before EOS, it never jumps over it
        assert contains_path(trie, [1, *path])


@pytest.mark.parametrize("mode", DRAFTING_MODES)
def test_only_banned_continuations_give_empty_draft(mode: DraftMode) -> None:
    trie = trie_of([[1, 0]])
    assert len(retrieve(trie, [1], cfg(mode), budget=8, max_depth=8, banned=frozenset({0}))) == 0


# ---- multi-stage ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", DRAFTING_MODES)
def test_falls_back_to_shorter_suffix_without_continuation(mode: DraftMode) -> None:
    # [1, 2] is in the trie but has no continuation (the prompt ends there); [2] continues with 3 4
    trie = trie_of([[2, 3, 4], [1, 2]])
    tree = retrieve(trie, [1, 2], cfg(mode), budget=8, max_depth=8)
    assert tree.paths() == [[3, 4]]


def test_longest_suffix_wins_when_it_fills_the_budget() -> None:
    # after [7, 1] the trie says 8; after [1] alone it mostly says 9
    trie = trie_of([[7, 1, 8], [1, 9], [1, 9], [1, 9]])
    tree = retrieve(trie, [7, 1], cfg(DraftMode.HIERARCHICAL, min_fill=0.5), budget=1, max_depth=4)
    assert tree.tokens == [8]
    tree = retrieve(trie, [5, 1], cfg(DraftMode.HIERARCHICAL), budget=1, max_depth=4)
    assert tree.tokens == [9]  # without the long match the short suffix decides


def test_thin_long_match_is_topped_up_from_shorter_suffix() -> None:
    # long match [7, 1] gives 1 node (< min_fill * budget), so [1] adds its continuations too
    trie = trie_of([[7, 1, 8], [1, 9, 10]])
    tree = retrieve(trie, [7, 1], cfg(DraftMode.HIERARCHICAL, min_fill=1.0), budget=4, max_depth=4)
    assert sorted(tree.paths()) == [[8], [9, 10]]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_no_match_gives_empty_draft(mode: DraftMode) -> None:
    trie = trie_of([[1, 2, 3]])
    assert len(retrieve(trie, [4, 5], cfg(mode), budget=8, max_depth=8)) == 0


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize(("budget", "max_depth"), [(0, 8), (8, 0)])
def test_zero_budget_or_depth_gives_empty_draft(mode: DraftMode, budget: int, max_depth: int) -> None:
    trie = trie_of([[1, 2, 3, 4]])
    assert len(retrieve(trie, [1], cfg(mode), budget=budget, max_depth=max_depth)) == 0


def test_mode_given_as_string() -> None:
    trie = trie_of([[1, 2, 3, 4]])
    config = DecodingConfig(mode="none")  # type: ignore[arg-type]
    assert len(retrieve(trie, [1], config, budget=8, max_depth=8)) == 0


# ---- property tests ------------------------------------------------------------------------------------
TOKENS = st.lists(st.integers(0, 4), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(TOKENS, max_size=3),
    outputs=st.lists(TOKENS, max_size=3),
    context=TOKENS,
    mode=st.sampled_from(ALL_MODES),
    budget=st.integers(0, 12),
    max_depth=st.integers(0, 8),
    length=st.integers(2, 6),
    max_match=st.integers(1, 6),
    min_fill=st.sampled_from([0.0, 0.5, 1.0]),
    banned=st.frozensets(st.integers(0, 4), max_size=2),
)
def test_every_drafted_branch_is_in_the_trie(
    prompts: list[list[int]],
    outputs: list[list[int]],
    context: list[int],
    mode: DraftMode,
    budget: int,
    max_depth: int,
    length: int,
    max_match: int,
    min_fill: float,
    banned: frozenset[int],
) -> None:
    trie = trie_of(prompts, outputs, length)
    trie_config = TrieConfig(branch_length=length)
    config = DecodingConfig(mode=mode, max_match=max_match, min_fill=min_fill, trie=trie_config)
    tree = retrieve(trie, context, config, budget=budget, max_depth=max_depth, banned=banned)
    check_tree_shape(tree)
    assert len(tree) <= draft_cap(config, budget)
    if min(max_match, len(context), length - 1) < config.extend_min_match:
        assert len(tree) <= budget  # no long match: the tree never grows past the budget
    assert tree.depth() <= max_depth
    assert not banned & set(tree.tokens)
    if mode in (DraftMode.NONE, DraftMode.JACOBI):  # jacobi drafts from its n-gram pool, never the trie
        assert len(tree) == 0
    if mode is DraftMode.LLMA:
        assert tree.parents == list(range(len(tree)))
    if mode is DraftMode.HIERARCHICAL:  # merged: no two siblings hold the same token
        pairs = list(zip(tree.parents, tree.tokens, strict=True))
        assert len(pairs) == len(set(pairs))
    longest = min(max_match, len(context), length - 1)
    suffixes = [context[len(context) - n :] for n in range(1, longest + 1)]
    for path in node_paths(tree):  # each node: suffix + branch is a path of the trie, or (a chain past the
        # trie's depth, extend_chain) its token follows a re-matched suffix of context + branch
        text = [*context, *path]
        rematched = [text[len(text) - n :] for n in range(config.extend_min_match + 1, len(text) + 1)]
        assert any(contains_path(trie, [*s, *path]) for s in suffixes) or any(
            len(w) <= length and contains_path(trie, w) for w in rematched), (path, suffixes)
    if len(tree) == 0 and mode in DRAFTING_MODES and budget > 0 and max_depth > 0 and min_fill > 0:
        # nothing drafted (and a thin draft would have tried shorter suffixes): no suffix has an
        # allowed continuation (min_fill 0 stops after the longest matching suffix, as documented)
        for s in suffixes:
            node = trie.find(s)
            assert node is None or not set(node.children) - banned


@pytest.mark.parametrize(("spec", "vocab", "paths"), [
    # every id in range: the same tree comes back
    ([(0, 1), (1, 2), (0, 3)], 10, [[1, 2], [3]]),
    # a bad node takes its subtree with it; its sibling stays
    ([(0, 1), (1, 12), (2, 4), (0, 3)], 10, [[1], [3]]),
    # a bad first node leaves nothing below the root on that side
    ([(0, 11), (1, 2), (0, 5), (3, 6)], 10, [[5, 6]]),
    # negative ids are not ids either
    ([(0, -1), (0, 4)], 10, [[4]]),
    # nothing valid: an empty tree
    ([(0, 10)], 10, []),
])
def test_within_vocab_drops_bad_nodes_and_their_subtrees(spec: list[tuple[int, int]], vocab: int,
                                                         paths: list[list[int]]) -> None:
    tree = DraftTree()
    for parent, token in spec:
        tree.add(parent, token, merge=False)
    out = within_vocab(tree, vocab)
    check_tree_shape(out)
    assert sorted(out.paths()) == sorted(paths)
    assert all(0 <= t < vocab for t in out.tokens)


def test_within_vocab_keeps_probabilities_and_lookups() -> None:
    # kept nodes keep their path probability, and a merged tree's (parent, token) lookup still works
    tree = DraftTree()
    a = tree.add(0, 1, prob=0.9)
    tree.add(a, 99, prob=0.5)
    b = tree.add(a, 2, prob=0.4)
    out = within_vocab(tree, 10)
    assert out.tokens == [1, 2] and out.probs == [0.9, 0.4]
    assert out.child(0, 1) == 1 and out.child(1, 2) == 2 and b == 3


def test_a_flat_cost_widens_the_budget_a_steep_one_keeps_it() -> None:
    # a launch-bound device (every width costs the same) widens 8 to the widest allowed; a CPU-like cost (each
    # token adds) keeps 8; a cost 1/64 of a token per token stops at 64; widest 0 (the CPU backend) never widens
    from lookahead_core.proposers.build import flat_budget

    config = DecodingConfig(mode="hierarchical", decoding_length=8, max_decoding_length=32)
    assert flat_budget(lambda n: 10.0, widest=128) == 128
    assert flat_budget(lambda n: 1.0 + n, widest=128) == 0
    assert flat_budget(lambda n: 10.0 + n / 64, widest=128) == 64
    wide = drafting_spec(config, lambda n: 10.0, widest=128).config
    assert (wide.decoding_length, wide.max_decoding_length) == (128, 128)
    assert drafting_spec(config, lambda n: 1.0 + n, widest=128).config.decoding_length == 8
    assert drafting_spec(config, lambda n: 10.0, widest=0).config.decoding_length == 8
    assert drafting_spec(DecodingConfig(mode="none"), lambda n: 10.0, widest=128).config.decoding_length == 8
