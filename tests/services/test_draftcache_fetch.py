"""DraftCacheStore.fetch: which continuations come back for a request, in what order, within the budget.

Settings are tests.services.draftcache_helpers.SMALL: depth-4 tries, bigram seeds, bigram similarity
(2 shared bigrams make a past output "similar"), half the budget for whole outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookahead_rag.services.draftcache.fetch import Continuation
from tests.builders import TOKENIZER
from tests.services.draftcache_helpers import small_settings, store_with

T = "acme"
Outputs = list[Sequence[int]]
Expected = list[tuple[list[int], float]]

FETCH_CASES: list[tuple[Outputs, list[int], int, Expected]] = [
    # one output, prompt ends in its first bigram: the continuation comes back, seed included
    ([[1, 2, 3, 4, 5]], [9, 1, 2], 20, [([1, 2, 3, 4, 5], 1.0)]),
    # chaining: a 7-token output comes back whole through a depth-4 trie (its end seeds the next lookup)
    ([[1, 2, 3, 4, 5, 6, 7]], [1, 2], 20, [([1, 2, 3, 4, 5, 6, 7], 1.0)]),
    # chaining joins two outputs that share the bigram (3, 4)
    ([[1, 2, 3, 4], [3, 4, 8, 9]], [1, 2], 20, [([1, 2, 3, 4, 8, 9], 1.0)]),
    # frequency ranking: the continuation seen twice first, weight = count of seed + first token
    ([[1, 2, 3], [1, 2, 3], [1, 2, 4]], [1, 2], 20, [([1, 2, 3], 2.0), ([1, 2, 4], 1.0)]),
    # equal frequency: the smaller token id first (deterministic)
    ([[1, 2, 7], [1, 2, 5]], [1, 2], 20, [([1, 2, 5], 1.0), ([1, 2, 7], 1.0)]),
    # the budget cuts the chain: 4 tokens in all
    ([[1, 2, 3, 4, 5, 6, 7]], [1, 2], 4, [([1, 2, 3, 4], 1.0)]),
    # a budget below seed + 1 token returns nothing
    ([[1, 2, 3, 4, 5, 6, 7]], [1, 2], 2, []),
    # no prompt bigram occurs in the trie: nothing
    ([[1, 2, 3]], [2, 1, 3], 20, []),
    # a similar past output (2 shared bigrams) comes back whole; its own bigrams are not repeated
    ([[5, 6, 7, 8, 9]], [5, 6, 7], 20, [([5, 6, 7, 8, 9], 1.0)]),
    # whole outputs get half the budget: cut to 4 tokens, and the rest adds nothing new
    ([[5, 6, 7, 8, 9]], [5, 6, 7], 8, [([5, 6, 7, 8], 1.0)]),
    # two similar outputs, most shared bigrams first (3 vs 2), then no trie continuation repeats them
    ([[2, 3, 4, 6], [1, 2, 3, 4, 5]], [1, 2, 3, 4], 40, [([1, 2, 3, 4, 5], 1.0), ([2, 3, 4, 6], 1.0)]),
    # the same output twice is kept once, weight 2
    ([[5, 6, 7, 8], [5, 6, 7, 8]], [5, 6, 7], 20, [([5, 6, 7, 8], 2.0)]),
    # a whole output first, then a trie continuation of a prompt bigram it does not hold
    ([[5, 6, 7, 8], [30, 31, 32]], [5, 6, 7, 30, 31], 20, [([5, 6, 7, 8], 1.0), ([30, 31, 32], 1.0)]),
    # an empty prompt (and no references) seeds nothing
    ([[1, 2, 3]], [], 20, []),
]


@pytest.mark.parametrize(("outputs", "prompt", "budget", "expected"), FETCH_CASES)
def test_fetch_cases(outputs: Outputs, prompt: list[int], budget: int, expected: Expected) -> None:
    store = store_with((T, ids) for ids in outputs)
    got = store.fetch(T, TOKENIZER, prompt, [], budget)
    assert [(b.ids, b.weight) for b in got] == expected


def test_reference_ids_seed_like_the_prompt() -> None:
    store = store_with([(T, [1, 2, 3])])
    assert store.fetch(T, TOKENIZER, [40], [1, 2], 20) == [Continuation([1, 2, 3], 1.0)]


def test_budget_zero_means_default() -> None:
    store = store_with([(T, list(range(1, 60)))], small_settings(default_budget=5))
    got = store.fetch(T, TOKENIZER, [1, 2], [], 0)
    assert sum(len(b.ids) for b in got) == 5


def test_max_chain_tokens_bounds_one_continuation() -> None:
    store = store_with([(T, list(range(1, 40)))], small_settings(max_chain_tokens=6))
    got = store.fetch(T, TOKENIZER, [1, 2], [], 64)
    assert got == [Continuation([1, 2, 3, 4, 5, 6], 1.0)]


def test_unknown_tenant_and_tokenizer_get_nothing() -> None:
    store = store_with([(T, [1, 2, 3])])
    assert store.fetch("nobody", TOKENIZER, [1, 2], [], 20) == []
    assert store.fetch(T, "other-tokenizer", [1, 2], [], 20) == []


# ---- properties over random outputs -----------------------------------------------------------
token_lists = st.lists(st.integers(0, 6), min_size=0, max_size=12)


def _ngrams(ids: Sequence[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outputs=st.lists(token_lists, min_size=1, max_size=8),
    other=st.lists(token_lists, min_size=1, max_size=4),
    prompt=token_lists,
    refs=token_lists,
    budget=st.integers(1, 64),
)
def test_fetch_properties(
    outputs: list[list[int]], other: list[list[int]], prompt: list[int], refs: list[int], budget: int
) -> None:
    other = [[t + 100 for t in ids] for ids in other]  # tenant B's tokens are disjoint from A's
    store = store_with([("A", ids) for ids in outputs] + [("B", ids) for ids in other])
    got = store.fetch("A", TOKENIZER, [*prompt, 100, 101], refs, budget)
    # budget respected
    assert sum(len(b.ids) for b in got) <= budget
    # deterministic
    assert got == store.fetch("A", TOKENIZER, [*prompt, 100, 101], refs, budget)
    # every step of every continuation is an n-gram of tenant A's outputs (seed 2 + next token = trigrams),
    # or the whole continuation is a prefix of one of A's outputs
    a_trigrams = set().union(*(_ngrams(ids, 3) for ids in outputs))
    for b in got:
        assert len(b.ids) >= 2 and b.weight >= 1
        is_prefix = any(list(ids[: len(b.ids)]) == b.ids for ids in outputs)
        assert is_prefix or _ngrams(b.ids, 3) <= a_trigrams, b
        # tenant B's tokens never come back to A
        assert all(t < 100 for t in b.ids)
