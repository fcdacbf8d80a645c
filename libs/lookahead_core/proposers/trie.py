"""The request's token trie as a proposer: the prompt, references and past answers it was filled with,
and how a trie's continuations become a draft (hierarchical trees, parallel chains, the LLMA single span).

Given the context (prompt + output so far), match its longest suffix in the trie (multi-stage:
long suffixes first, shorter ones while the draft is still thin) and take the highest-scoring
continuations until the decoding-length budget is filled. A node's score is its path probability
under the trie's counts: the product of count(child) / sum(count(siblings)) along the branch.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence
from dataclasses import replace

from ..config import DecodingConfig
from ..drafting.draft import DraftTree
from ..drafting.trie import Node, TokenTrie
from .base import Ask, Proposer


class TrieShape(enum.Enum):
    """How a trie's continuations become a draft."""

    TREE = "tree"  # best-first tree, shared prefixes merged (Lookahead's hierarchical drafts)
    CHAINS = "chains"  # separate chains, shared prefixes not merged (parallel)
    SPAN = "span"  # the single most probable chain under the longest match (LLMA)


class TrieProposer(Proposer):
    """Drafts from ``trie`` in ``shape`` (a tree, parallel chains or one span) each step."""

    def __init__(self, trie: TokenTrie, config: DecodingConfig, shape: TrieShape) -> None:
        self.trie = trie
        self.config = config
        self.shape = shape

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        cfg = self.config
        grow = min(ask.extend_to, cfg.max_decoding_length)  # confident copies of any text
        if grow != cfg.max_decoding_length:
            cfg = replace(cfg, max_decoding_length=grow)
        own = retrieve_draft(self.trie, ask.context[-cfg.max_match :], cfg, budget=ask.budget, max_depth=ask.room,
                             banned=ask.banned, shape=self.shape, chain_to=ask.extend_to)
        tree.merge(own, merge=self.shape is not TrieShape.CHAINS)


def _children(node: Node, prompt_weight: float, banned: frozenset[int]) -> list[tuple[float, int, Node]]:
    """(probability, token, child) of a node's children by weight, banned tokens left out."""
    kids = [(c.weight(prompt_weight), t, c) for t, c in node.children.items() if t not in banned]
    total = sum(w for w, _, _ in kids)
    if total <= 0:
        return []
    return [(w / total, t, c) for w, t, c in kids]


def _match_nodes(trie: TokenTrie, context: Sequence[int], config: DecodingConfig) -> list[tuple[int, Node]]:
    """(suffix length, trie node) of the context's suffixes with continuations, longest first."""
    longest = min(config.max_match, len(context), trie.config.branch_length - 1)
    out = []
    for n in range(longest, config.min_match - 1, -1):
        node = trie.find(context[len(context) - n :])
        if node is not None and node.children:
            out.append((n, node))
    return out


def _grow_tree(
    tree: DraftTree,
    start: Node,
    budget: int,
    max_depth: int,
    prompt_weight: float,
    banned: frozenset[int],
    base: int,
    min_prob: float,
) -> None:
    """Best-first: add the highest path-probability nodes under ``start`` until the budget is met.

    The first ``base`` nodes are taken whatever their probability; beyond that (up to ``budget``)
    only nodes whose path probability is at least ``min_prob``.
    """
    # heap entries: (-path probability, tiebreak, tree parent index, token, trie node, depth)
    heap: list[tuple[float, int, int, int, Node, int]] = []
    tick = 0
    for prob, token, child in _children(start, prompt_weight, banned):
        tick += 1
        heap.append((-prob, tick, 0, token, child, 1))
    heapq.heapify(heap)
    while heap and len(tree) < budget:
        neg_prob, _, parent, token, node, depth = heapq.heappop(heap)
        if len(tree) >= base and -neg_prob < min_prob:
            break  # past the base budget only confident nodes are worth their verification cost
        idx = tree.add(parent, token, prob=-neg_prob)
        if depth >= max_depth:
            continue
        for prob, child_token, child in _children(node, prompt_weight, banned):
            tick += 1
            heapq.heappush(heap, (neg_prob * prob, tick, idx, child_token, child, depth + 1))


def _best_chains(
    start: Node, budget: int, max_depth: int, prompt_weight: float, banned: frozenset[int]
) -> list[list[int]]:
    """Root-to-leaf chains under ``start``, most probable first, until their tokens fill the budget."""
    heap: list[tuple[float, int, list[int], Node]] = [(-1.0, 0, [], start)]
    chains: list[list[int]] = []
    used = 0
    tick = 0
    while heap and used < budget:
        neg_prob, _, path, node = heapq.heappop(heap)
        kids = _children(node, prompt_weight, banned) if len(path) < max_depth else []
        if not kids:
            if path:
                chain = path[: budget - used]
                chains.append(chain)
                used += len(chain)
            continue
        for prob, token, child in kids:
            tick += 1
            heapq.heappush(heap, (neg_prob * prob, tick, [*path, token], child))
    return chains


def retrieve_draft(
    trie: TokenTrie,
    context: Sequence[int],
    config: DecodingConfig,
    budget: int,
    max_depth: int,
    banned: frozenset[int] = frozenset(),
    shape: TrieShape = TrieShape.TREE,
    chain_to: int = 0,
) -> DraftTree:
    """Build this step's draft below the last context token, in ``shape``.

    ``budget`` caps the number of draft tokens, ``max_depth`` the length of any branch (so a
    step never emits past max_new_tokens); ``banned`` tokens (EOS) never appear in a draft. A TREE
    may grow confident nodes past ``budget`` up to ``config.max_decoding_length``, and a confident
    branch that past outputs continue up to ``chain_to`` nodes (``extend_chain``; 0: the same cap).
    """
    tree = DraftTree()
    if budget <= 0 or max_depth <= 0:
        return tree
    weight = config.trie.prompt_weight
    with trie.lock:
        stages = _match_nodes(trie, context, config)
        if shape is TrieShape.SPAN:
            # The single best-matching span: the most probable chain under the longest match.
            for _, node in stages:
                chains = _best_chains(node, budget, min(max_depth, budget), weight, banned)
                if chains:
                    tree.add_chain(chains[0], merge=True)
                    break
            return tree
        want = config.min_fill * budget
        seen_chains: set[tuple[int, ...]] = set()
        copying = False  # a long match was seen: confident copies may grow past the budget
        for matched, node in stages:
            if shape is TrieShape.TREE:
                # A long suffix match means the text is being copied: then confident nodes may
                # extend the tree past the base budget (LLMA's match length as evidence).
                extend = matched >= config.extend_min_match
                copying = copying or extend
                cap = max(budget, config.max_decoding_length) if extend else budget
                _grow_tree(tree, node, cap, max_depth, weight, banned, budget, config.extend_min_prob)
            else:  # CHAINS: separate chains, shared prefixes are not merged
                for chain in _best_chains(node, budget - len(tree), max_depth, weight, banned):
                    if tuple(chain) not in seen_chains:  # a shorter suffix may find the same chain
                        seen_chains.add(tuple(chain))
                        tree.add_chain(chain, merge=False)
            if len(tree) >= want:
                break
        if copying:
            extend_chain(tree, trie, context, config, max(budget, chain_to or config.max_decoding_length), max_depth,
                         banned)
    return tree


def _deepest_confident(tree: DraftTree, min_prob: float) -> int:
    """The deepest node whose path probability is at least ``min_prob`` (the first on a tie; 0: none)."""
    best = 0
    for node in range(1, len(tree) + 1):
        if tree.probs[node - 1] >= min_prob and (not best or tree.depths[node - 1] > tree.depths[best - 1]):
            best = node
    return best


def _branch(tree: DraftTree, node: int) -> list[int]:
    """Tokens from below the root down to ``node``."""
    out: list[int] = []
    while node:
        out.append(tree.tokens[node - 1])
        node = tree.parents[node - 1]
    return out[::-1]


def _rematch(trie: TokenTrie, text: Sequence[int], config: DecodingConfig) -> Node | None:
    """The trie node of ``text``'s longest suffix (extend_min_match..max_match tokens) with children."""
    longest = min(config.max_match, len(text), trie.config.branch_length - 1)
    for n in range(longest, config.extend_min_match - 1, -1):
        node = trie.find(text[len(text) - n :])
        if node is not None and node.children:
            return node
    return None


def extend_chain(tree: DraftTree, trie: TokenTrie, context: Sequence[int], config: DecodingConfig, cap: int,
                 max_depth: int, banned: frozenset[int] = frozenset()) -> None:
    """Continue the tree's deepest confident branch past the trie's depth, as one chain of past output.

    A branch's depth is bounded by the trie's (``branch_length`` minus the match), so a long copy -- an
    answer the tenant was given before -- would need many steps. Here the context plus the branch is
    matched again (its last extend_min_match..max_match tokens) and the most probable child followed,
    again and again, while that child was seen in an output (a past answer or this one: prompt text
    alone is no evidence the model will copy it that far) and the path probability stays at least
    ``extend_min_prob`` (each child's share multiplies it), until ``cap`` nodes or ``max_depth``.
    Example: a trie of 4-token windows of the output [1..20], context [1, 2, 3] -> the tree [4, 5, 6]
    (depth 3) continues 7, 8, ... up to ``cap``; where the trie forks 50/50 the chain stops (the caller
    holds ``trie.lock``).
    """
    node = _deepest_confident(tree, config.extend_min_prob)
    if not node or len(tree) >= cap:
        return
    text = [*context[-config.max_match :], *_branch(tree, node)]
    prob, depth = tree.probs[node - 1], tree.depths[node - 1]
    weight = config.trie.prompt_weight
    at: Node | None = None
    while len(tree) < cap and depth < max_depth:
        if at is None or not at.children:
            at = _rematch(trie, text, config)
        kids = _children(at, weight, banned) if at is not None else []
        if not kids:
            return
        share, token, at = max(kids, key=lambda kid: kid[0])
        prob *= share
        if prob < config.extend_min_prob or not at.freq:
            return
        node = tree.add(node, token, prob=prob)
        text = [*text, token][-config.max_match :]
        depth += 1
