"""TokenTrie and OutputCursor: exact n-gram counts, owners, pruning, snapshots (pure Python)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lookahead_core.config import TrieConfig
from lookahead_core.drafting.trie import TokenTrie, windows

from tests.core.helpers import freq_table, ngram_counts, pfreq_table, trie_table
from tests.core.peek import contains_path, insert_branch

Counts = dict[tuple[int, ...], int]

# ---- windows / counts: table-driven, expected n-gram counts written out by hand ----------------------
COUNT_CASES: list[tuple[list[int], int, Counts]] = [
    # three distinct tokens, windows as long as the sequence: every n-gram once
    ([1, 2, 3], 3, {(1,): 1, (2,): 1, (3,): 1, (1, 2): 1, (2, 3): 1, (1, 2, 3): 1}),
    # same sequence, branch_length 2: the 3-gram is not stored, shorter counts unchanged
    ([1, 2, 3], 2, {(1,): 1, (2,): 1, (3,): 1, (1, 2): 1, (2, 3): 1}),
    # a run of one token: overlapping occurrences all count (4 unigrams, 3 bigrams, 2 trigrams)
    ([7, 7, 7, 7], 3, {(7,): 4, (7, 7): 3, (7, 7, 7): 2}),
    # alternating tokens: tail windows keep the counts exact at the end of the sequence
    ([1, 2, 1, 2, 1], 3, {(1,): 3, (2,): 2, (1, 2): 2, (2, 1): 2, (1, 2, 1): 2, (2, 1, 2): 1}),
    # a single token
    ([5], 4, {(5,): 1}),
    # empty sequence inserts nothing
    ([], 4, {}),
]


@pytest.mark.parametrize(("tokens", "length", "expected"), COUNT_CASES)
def test_output_counts_are_ngram_counts(tokens: list[int], length: int, expected: Counts) -> None:
    trie = TokenTrie(TrieConfig(branch_length=length))
    trie.insert_output(tokens)
    assert freq_table(trie) == expected
    assert pfreq_table(trie) == {}
    assert trie.node_count == len(expected)
    assert trie.output_node_count == len(expected)


@pytest.mark.parametrize(("tokens", "length", "expected"), COUNT_CASES)
def test_prompt_counts_are_ngram_counts(tokens: list[int], length: int, expected: Counts) -> None:
    trie = TokenTrie(TrieConfig(branch_length=length))
    trie.insert_prompt(tokens, owner="a")
    assert pfreq_table(trie) == expected
    assert freq_table(trie) == {}
    assert trie.node_count == len(expected)
    assert trie.output_node_count == 0  # prompt nodes are not what capacity bounds


def test_windows_include_tail_windows() -> None:
    # every start position yields one window; the last ones are shorter
    assert [list(w) for w in windows([1, 2, 3, 4], 2)] == [[1, 2], [2, 3], [3, 4], [4]]


def test_prompt_and_output_counts_are_kept_apart() -> None:
    trie = TokenTrie(TrieConfig(branch_length=3))
    trie.insert_prompt([1, 2, 3], owner="a")
    trie.insert_output([2, 3, 4])
    table = trie_table(trie)
    assert table[(2, 3)] == (1, 1)  # one output and one prompt occurrence
    assert table[(1, 2, 3)] == (0, 1)  # prompt only
    assert table[(2, 3, 4)] == (1, 0)  # output only
    assert trie.node_count == 9  # 1,2,3,12,23,123 from the prompt + 4,34,234 new from the output
    assert trie.output_node_count == 3  # (4,), (3, 4), (2, 3, 4)
    assert trie.root.children[2].weight(trie.config.prompt_weight) == 1 + 100.0


# ---- remove_owner: table-driven ---------------------------------------------------------------------
OWNER_CASES: list[tuple[list[tuple[str, list[int]]], list[list[int]], str]] = [
    # the only owner goes: every prompt node goes, the trie is empty again
    ([("a", [1, 2, 3])], [], "a"),
    # two owners share n-grams: removing one halves the shared counts, the other's nodes stay
    ([("a", [1, 2, 3]), ("b", [2, 3, 4])], [], "a"),
    # an output shares nodes with the prompt: they stay (output counts), prompt-only nodes go
    ([("a", [1, 2, 3])], [[2, 3, 9]], "a"),
    # the same owner inserted two sequences (prompt + reference): both are removed
    ([("a", [1, 2]), ("a", [5, 6]), ("b", [1, 2])], [[6, 7]], "a"),
    # removing an owner that never inserted anything changes nothing
    ([("a", [1, 2, 3])], [[3, 4]], "zzz"),
]


@pytest.mark.parametrize(("prompts", "outputs", "gone"), OWNER_CASES)
def test_remove_owner_restores_previous_counts(
    prompts: list[tuple[str, list[int]]], outputs: list[list[int]], gone: str
) -> None:
    config = TrieConfig(branch_length=3)
    trie = TokenTrie(config)
    expected = TokenTrie(config)  # the same trie built without the removed owner
    for tokens in outputs:
        trie.insert_output(tokens)
        expected.insert_output(tokens)
    for owner, tokens in prompts:
        trie.insert_prompt(tokens, owner)
        if owner != gone:
            expected.insert_prompt(tokens, owner)
    trie.remove_owner(gone)
    assert trie_table(trie) == trie_table(expected)  # same nodes, same counts: nothing left over
    assert trie.node_count == expected.node_count == len(trie_table(trie))
    assert trie.output_node_count == expected.output_node_count


def test_remove_owner_deletes_nodes_nothing_holds() -> None:
    trie = TokenTrie(TrieConfig(branch_length=3))
    trie.insert_output([2, 3])
    trie.insert_prompt([1, 2, 3], owner="a")
    trie.remove_owner("a")
    assert set(trie_table(trie)) == {(2,), (3,), (2, 3)}
    assert trie.find([1]) is None
    assert trie.node_count == 3


# ---- pruning -----------------------------------------------------------------------------------------
def test_prune_removes_least_frequent_output_leaves_first() -> None:
    config = TrieConfig(branch_length=2, capacity=4, prune_slack=0.0)
    trie = TokenTrie(config)
    for _ in range(3):
        trie.insert_output([1, 2], prune=False)  # (1,) (2,) (1,2): freq 3
    trie.insert_output([8, 9], prune=False)  # (8,) (9,) (8,9): freq 1
    assert trie.output_node_count == 6
    removed = trie.maybe_prune()
    assert removed == 2
    assert trie.output_node_count == 4 <= config.capacity
    kept = freq_table(trie)
    assert {(1,): 3, (2,): 3, (1, 2): 3}.items() <= kept.items()  # the frequent n-grams all survive
    assert (8, 9) not in kept  # of the rare ones the deepest (a leaf) goes first
    assert len(kept.keys() & {(8,), (9,)}) == 1


def test_prune_never_removes_prompt_nodes() -> None:
    config = TrieConfig(branch_length=3, capacity=2, prune_slack=0.0)
    trie = TokenTrie(config)
    trie.insert_prompt([4, 5, 6], owner="a")  # prompt nodes, each count 1 (rarer than the output's)
    for _ in range(5):
        trie.insert_output([1, 2, 3], prune=False)
    before = pfreq_table(trie)
    trie.maybe_prune()
    assert pfreq_table(trie) == before  # every prompt node and count is still there
    assert trie.output_node_count <= config.capacity
    for path in freq_table(trie):  # what is left of the output is still prefix-closed
        assert trie.find(path[:-1]) is not None


def test_prune_slack_prunes_below_capacity() -> None:
    config = TrieConfig(branch_length=2, capacity=10, prune_slack=0.5)
    trie = TokenTrie(config)
    trie.insert_output(list(range(20)))  # 20 unigrams + 19 bigrams = 39 output nodes
    assert trie.output_node_count <= 5  # pruned to (1 - slack) * capacity, not just to capacity
    assert trie.node_count == len(trie_table(trie))


def test_no_prune_at_or_under_capacity() -> None:
    trie = TokenTrie(TrieConfig(branch_length=2, capacity=5))
    trie.insert_output([1, 2, 3])  # 3 unigrams + 2 bigrams = exactly capacity
    assert trie.maybe_prune() == 0
    assert trie.output_node_count == 5


# ---- OutputCursor --------------------------------------------------------------------------------------
CURSOR_CASES: list[tuple[list[int], int, list[int]]] = [
    # distinct tokens fed one by one
    ([1, 2, 3, 4, 5], 3, [1, 1, 1, 1, 1]),
    # repeated token: the open windows overlap
    ([7, 7, 7, 7, 7, 7], 4, [1, 1, 1, 1, 1, 1]),
    # fed in uneven chunks (as a decoder emits several tokens a step)
    ([1, 2, 1, 2, 1, 2, 3], 3, [3, 1, 3]),
    # windows longer than the sequence
    ([4, 5], 6, [2]),
]


@pytest.mark.parametrize(("tokens", "length", "chunks"), CURSOR_CASES)
def test_cursor_equals_insert_output(tokens: list[int], length: int, chunks: list[int]) -> None:
    config = TrieConfig(branch_length=length)
    fed, whole = TokenTrie(config), TokenTrie(config)
    cursor = fed.output_cursor()
    at = 0
    for size in chunks:
        cursor.feed(tokens[at : at + size])
        at += size
    cursor.close()
    whole.insert_output(tokens)
    assert trie_table(fed) == trie_table(whole)
    assert fed.node_count == whole.node_count
    assert fed.outputs_inserted == whole.outputs_inserted == 1


def test_cursor_survives_pruning_by_another_output() -> None:
    config = TrieConfig(branch_length=4, capacity=4, prune_slack=0.0)
    trie = TokenTrie(config)
    cursor = trie.output_cursor()  # request A's output, still growing
    cursor.feed([1, 2, 3])
    trie.insert_output([9, 8, 7, 6, 5, 4])  # request B finishes: prunes (A's open nodes among others)
    cursor.feed([4, 5])
    assert trie.node_count == len(trie_table(trie))  # the counter matches the nodes really held
    assert trie.find([4, 5]) is not None and trie.find([3, 4, 5]) is not None  # A's n-grams are in the trie


# feed chunk sizes of one output fed through a cursor (as the decoder feeds each step's tokens)
CURSOR_PRUNE_CASES: list[tuple[list[int], list[int]]] = [
    # one token per feed: every n-gram node is stamped one step later than its prefix node
    ([1, 2, 3, 4], [1, 1, 1, 1]),
    # uneven steps of a longer output
    ([1, 2, 3, 4, 5, 6, 7, 8], [1, 3, 1, 2, 1]),
    # a repeated token: counts above 1 and the same nodes touched by several steps
    ([5, 5, 6, 5, 5, 6, 7], [2, 1, 1, 3]),
]


@pytest.mark.parametrize(("tokens", "chunks"), CURSOR_PRUNE_CASES)
def test_capacity_holds_after_a_cursor_fed_output(tokens: list[int], chunks: list[int]) -> None:
    config = TrieConfig(branch_length=3, capacity=4, prune_slack=0.0)
    trie = TokenTrie(config)
    cursor = trie.output_cursor()
    at = 0
    for size in chunks:
        cursor.feed(tokens[at : at + size])
        at += size
    cursor.close()  # prunes
    assert trie.output_node_count <= config.capacity
    assert trie.node_count == len(trie_table(trie))


# ---- snapshot ------------------------------------------------------------------------------------------
def test_dump_load_roundtrip_keeps_output_counts_only() -> None:
    config = TrieConfig(branch_length=3)
    trie = TokenTrie(config)
    trie.insert_output([1, 2, 3, 1, 2])
    trie.insert_output([2, 3, 4])
    trie.insert_prompt([1, 2, 9], owner="a")  # prompt branches are request-scoped: not in the snapshot
    loaded = TokenTrie.load_outputs(trie.dump_outputs())
    assert loaded.config.branch_length == 3
    assert freq_table(loaded) == freq_table(trie)
    assert pfreq_table(loaded) == {}
    assert loaded.outputs_inserted == 2
    assert loaded.node_count == len(freq_table(trie))
    assert loaded.dump_outputs() == trie.dump_outputs()  # a fixed point
    loaded.insert_output([3, 4])  # still a working trie
    assert loaded.find([3, 4]).freq == 2  # type: ignore[union-attr]


def test_dump_load_empty_and_big_tokens() -> None:
    empty = TokenTrie.load_outputs(TokenTrie(TrieConfig(branch_length=5)).dump_outputs())
    assert empty.node_count == 0 and empty.config.branch_length == 5
    trie = TokenTrie(TrieConfig(branch_length=2))
    trie.insert_output([151_000, 0, 151_000])  # ids of large vocabularies fit the record
    assert freq_table(TokenTrie.load_outputs(trie.dump_outputs())) == freq_table(trie)


# ---- sizes ---------------------------------------------------------------------------------------------
def test_node_count_and_nbytes_move() -> None:
    trie = TokenTrie(TrieConfig(branch_length=3))
    empty_bytes = trie.nbytes()
    assert trie.node_count == 0
    trie.insert_output([1, 2, 3, 4])
    assert trie.node_count == 9  # 4 unigrams + 3 bigrams + 2 trigrams
    grown = trie.nbytes()
    assert grown > empty_bytes
    trie.insert_prompt([7, 8], owner="a")
    assert trie.node_count == 12
    with_prompt = trie.nbytes()
    assert with_prompt > grown
    trie.remove_owner("a")
    assert trie.node_count == 9
    assert trie.nbytes() < with_prompt  # the three nodes and their child maps are gone


def test_insert_branch_counts_one_path() -> None:
    trie = TokenTrie(TrieConfig(branch_length=3))
    insert_branch(trie, [1, 2, 3, 4, 5], count=4)  # cut at branch_length, only prefixes of the path
    assert freq_table(trie) == {(1,): 4, (1, 2): 4, (1, 2, 3): 4}
    assert contains_path(trie, [1, 2, 3]) and not contains_path(trie, [2])
    assert sorted(trie.branches()) == [(1, 2, 3)]


# ---- property tests ------------------------------------------------------------------------------------
SEQ = st.lists(st.integers(0, 5), min_size=0, max_size=24)  # small alphabet: many shared n-grams
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(outputs=st.lists(SEQ, max_size=5), prompts=st.lists(SEQ, max_size=4), length=st.integers(2, 6))
def test_counts_match_brute_force(outputs: list[list[int]], prompts: list[list[int]], length: int) -> None:
    trie = TokenTrie(TrieConfig(branch_length=length, capacity=10**9))
    for out in outputs:
        trie.insert_output(out)
    for i, prompt in enumerate(prompts):
        trie.insert_prompt(prompt, owner=f"o{i}")
    assert freq_table(trie) == dict(ngram_counts(outputs, length))
    assert pfreq_table(trie) == dict(ngram_counts(prompts, length))
    assert trie.node_count == len(trie_table(trie))


@PROPS
@given(
    outputs=st.lists(SEQ, min_size=1, max_size=8),
    prompt=SEQ,
    capacity=st.integers(1, 30),
    slack=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_capacity_holds_after_pruning(
    outputs: list[list[int]], prompt: list[int], capacity: int, slack: float
) -> None:
    trie = TokenTrie(TrieConfig(branch_length=4, capacity=capacity, prune_slack=slack))
    trie.insert_prompt(prompt, owner="p")
    prompt_counts = pfreq_table(trie)
    for out in outputs:
        trie.insert_output(out)
        assert trie.output_node_count <= capacity
    assert pfreq_table(trie) == prompt_counts  # pruning never touches prompt counts
    assert trie.node_count == len(trie_table(trie))
    table = trie_table(trie)
    for path, (freq, _) in table.items():
        if len(path) > 1:  # prefix-closed, and a child never counts more than its parent
            assert table[path[:-1]][0] >= freq


@PROPS
@given(
    owners=st.lists(st.lists(SEQ, min_size=1, max_size=2), min_size=2, max_size=4),
    outputs=st.lists(SEQ, max_size=3),
    gone=st.integers(0, 3),
)
def test_removing_one_owner_leaves_the_others(
    owners: list[list[list[int]]], outputs: list[list[int]], gone: int
) -> None:
    gone %= len(owners)
    trie = TokenTrie(TrieConfig(branch_length=3, capacity=10**9))
    for out in outputs:
        trie.insert_output(out)
    for i, seqs in enumerate(owners):
        for seq in seqs:
            trie.insert_prompt(seq, owner=f"o{i}")
    trie.remove_owner(f"o{gone}")
    kept = [seq for i, seqs in enumerate(owners) if i != gone for seq in seqs]
    assert pfreq_table(trie) == dict(ngram_counts(kept, 3))
    assert freq_table(trie) == dict(ngram_counts(outputs, 3))
    assert trie.node_count == len(trie_table(trie))  # nodes nothing holds are gone
    assert trie.output_node_count == sum(1 for _, p in trie_table(trie).values() if p == 0)


@PROPS
@given(tokens=SEQ, length=st.integers(2, 6), cuts=st.lists(st.integers(0, 24), max_size=6))
def test_cursor_any_chunking_equals_insert_output(
    tokens: list[int], length: int, cuts: Sequence[int]
) -> None:
    config = TrieConfig(branch_length=length, capacity=10**9)
    fed, whole = TokenTrie(config), TokenTrie(config)
    cursor = fed.output_cursor()
    bounds = sorted({0, len(tokens), *(c for c in cuts if c < len(tokens))})
    for a, b in itertools.pairwise(bounds):
        cursor.feed(tokens[a:b])
    cursor.close()
    whole.insert_output(tokens)
    assert trie_table(fed) == trie_table(whole)
    assert fed.node_count == whole.node_count


@PROPS
@example(outputs=[[1, 2, 3, 4]], chunk=1, capacity=4)  # the minimal case: one token a step
@given(outputs=st.lists(SEQ, min_size=1, max_size=6), chunk=st.integers(1, 4), capacity=st.integers(1, 30))
def test_capacity_holds_after_cursor_outputs(outputs: list[list[int]], chunk: int, capacity: int) -> None:
    trie = TokenTrie(TrieConfig(branch_length=4, capacity=capacity, prune_slack=0.0))
    for out in outputs:
        cursor = trie.output_cursor()
        for at in range(0, len(out), chunk):
            cursor.feed(out[at : at + chunk])
        cursor.close()
        assert trie.output_node_count <= capacity


def test_prompt_nodes_stop_at_their_cap_and_leave_whole() -> None:
    # past max_prompt_nodes a prompt's later windows are not inserted; removing the owner removes
    # exactly what went in (nothing is left, and nothing else is touched)
    trie = TokenTrie(TrieConfig(branch_length=4, max_prompt_nodes=10))
    trie.insert_output([1, 2, 3])
    before = trie_table(trie)
    inserted = trie.insert_prompt(list(range(100, 140)), "big")
    assert inserted < 40  # cut short: 40 windows would make ~154 nodes
    assert trie.node_count - trie.output_node_count < 10 + 4  # the cap, overshot by at most one window
    trie.remove_owner("big")
    assert trie_table(trie) == before


def test_prompt_under_the_cap_is_inserted_whole() -> None:
    # a prompt that fits inserts every window (the cap changes nothing below it)
    trie = TokenTrie(TrieConfig(branch_length=4, max_prompt_nodes=1000))
    assert trie.insert_prompt([5, 6, 7, 5, 6], "p") == 5
    assert pfreq_table(trie)[(5, 6)] == 2
