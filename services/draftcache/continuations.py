"""Chained continuations: how a tenant's past outputs continued the n-grams of this request.

Seeds are the distinct n-grams of the prompt and references (longest lengths first) that the
tenant trie continues. Each seed's most frequent continuations are candidates, most frequent
first; a taken candidate is extended greedily (most frequent child of the longest matching suffix,
so the end of a continuation seeds the next lookup) until the trie has nothing more, the chain is long
enough, or the next step would repeat an n-gram some returned continuation already holds. Deterministic:
every tie is broken by token id or by first occurrence in the query.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from lookahead_core.drafting.trie import Node, TokenTrie

from lookahead_rag.services.draftcache.references import distinct_ngrams

MIN_COVERED_NGRAM = 2  # shortest n-gram a Coverage records: a step is (context >= 1 token, next token)


class Coverage:
    """The n-grams (lengths 2 .. context+1) of everything a fetch returned so far."""

    def __init__(self, context: int) -> None:
        self.context = context  # tokens before a step that identify it
        self._grams: set[tuple[int, ...]] = set()

    def add_sequence(self, tokens: Sequence[int]) -> None:
        for end in range(1, len(tokens) + 1):
            self._add_ending_at(tokens, end)

    def add_last(self, tokens: Sequence[int]) -> None:
        """Record the n-grams that end at the last token (after appending it)."""
        self._add_ending_at(tokens, len(tokens))

    def _add_ending_at(self, tokens: Sequence[int], end: int) -> None:
        for n in range(MIN_COVERED_NGRAM, min(self.context + 1, end) + 1):
            self._grams.add(tuple(tokens[end - n : end]))

    def covers(self, tail: Sequence[int], token: int) -> bool:
        """Whether the step ``tail -> token`` (last ``context`` tokens of tail) was returned already."""
        return (*tail[max(0, len(tail) - self.context) :], token) in self._grams


@dataclass(frozen=True)
class WalkLimits:
    """How far seeds and chains go."""

    seed_ngrams: tuple[int, ...]  # query n-gram lengths looked up, longest first
    max_seed_children: int  # continuations taken under one seed
    max_chain_tokens: int  # longest returned continuation, seed included
    max_match: int  # longest suffix looked up when extending a chain (branch_length - 1)

    @property
    def min_match(self) -> int:
        """Shortest suffix that may still extend a chain (the shortest seed)."""
        return min(self.seed_ngrams)


def _most_frequent_child(node: Node) -> tuple[int, Node]:
    return max(node.children.items(), key=lambda kv: (kv[1].freq, -kv[0]))


def _suffix_node(trie: TokenTrie, seq: Sequence[int], longest: int, shortest: int) -> tuple[Node, int] | None:
    """The trie node of the longest suffix of ``seq`` (``shortest``..``longest`` tokens) with children."""
    for n in range(min(longest, len(seq)), shortest - 1, -1):
        node = trie.find(seq[len(seq) - n :])
        if node is not None and node.children:
            return node, n
    return None


def _extend(
    trie: TokenTrie,
    seq: list[int],
    node: Node,
    depth: int,
    limit: int,
    limits: WalkLimits,
    coverage: Coverage,
) -> None:
    """Append the most frequent continuation while one exists, ``seq`` is shorter than ``limit`` and new."""
    while len(seq) < limit:
        if depth > limits.max_match or not node.children:
            found = _suffix_node(trie, seq, min(depth - 1, limits.max_match), limits.min_match)
            if found is None:
                return
            node, depth = found
        token, child = _most_frequent_child(node)
        if coverage.covers(seq, token):
            return
        seq.append(token)
        coverage.add_last(seq)
        node, depth = child, depth + 1


# heap entry: (-frequency, -seed length, first-occurrence order, token, seed, child node)
_Candidate = tuple[int, int, int, int, tuple[int, ...], Node]


def _seed_candidates(trie: TokenTrie, query: Sequence[int], limits: WalkLimits) -> list[_Candidate]:
    heap: list[_Candidate] = []
    for n in sorted(set(limits.seed_ngrams), reverse=True):
        for seed in distinct_ngrams(query, n):
            node = trie.find(seed)
            if node is None or not node.children:
                continue
            kids = sorted(node.children.items(), key=lambda kv: (-kv[1].freq, kv[0]))
            for token, child in kids[: limits.max_seed_children]:
                heap.append((-child.freq, -n, len(heap), token, seed, child))
    heapq.heapify(heap)
    return heap


def trie_continuations(
    trie: TokenTrie, query: Sequence[int], budget: int, limits: WalkLimits, coverage: Coverage
) -> list[tuple[list[int], float]]:
    """Chained continuations of ``query``'s n-grams, most frequent first, ``budget`` tokens in all.

    Each is (seed + continuation ids, output frequency of the seed followed by its first token).
    """
    heap = _seed_candidates(trie, query, limits)
    out: list[tuple[list[int], float]] = []
    remaining = budget
    while heap and remaining > 0:
        neg_freq, _, _, token, seed, child = heapq.heappop(heap)
        if len(seed) + 1 > remaining or coverage.covers(seed, token):
            continue
        seq = [*seed, token]
        coverage.add_sequence(seq)
        _extend(trie, seq, child, len(seq), min(limits.max_chain_tokens, remaining), limits, coverage)
        out.append((seq, float(-neg_freq)))
        remaining -= len(seq)
    return out
