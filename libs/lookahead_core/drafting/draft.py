"""Draft retrieval from a token trie: hierarchical trees, parallel chains, the LLMA single span.

Given the context (prompt + output so far), match its longest suffix in the trie (multi-stage:
long suffixes first, shorter ones while the draft is still thin) and take the highest-scoring
continuations until the decoding-length budget is filled. A node's score is its path probability
under the trie's counts: the product of count(child) / sum(count(siblings)) along the branch.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config import DecodingConfig
from .trie import Node, TokenTrie


class TrieShape(enum.Enum):
    """How a trie's continuations become a draft."""

    TREE = "tree"  # best-first tree, shared prefixes merged (Lookahead's hierarchical drafts)
    CHAINS = "chains"  # separate chains, shared prefixes not merged (parallel)
    SPAN = "span"  # the single most probable chain under the longest match (LLMA)


@dataclass
class DraftTree:
    """A draft tree below the root (the last emitted token, not yet in the KV cache).

    Node i (1-based in the flattened order) has ``tokens[i-1]`` and parent ``parents[i-1]``
    (0 = root). Parents always come before their children.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # trie path probability of each node
    _index: dict[tuple[int, int], int] = field(default_factory=dict)  # (parent, token) -> node

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, merge: bool = True, prob: float = 1.0) -> int:
        """Add ``token`` under ``parent``; with ``merge`` an existing identical child is reused."""
        if merge:
            hit = self._index.get((parent, token))
            if hit is not None:
                return hit
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(prob)
        self.depths.append(1 if parent == 0 else self.depths[parent - 1] + 1)
        node = len(self.tokens)
        if merge:
            self._index[(parent, token)] = node
        return node

    def child(self, parent: int, token: int) -> int | None:
        """The merged node ``token`` under ``parent``, if the tree has one."""
        return self._index.get((parent, token))

    def add_chain(self, chain: Sequence[int], merge: bool) -> None:
        """Add a chain below the root."""
        parent = 0
        for token in chain:
            parent = self.add(parent, token, merge=merge)

    def merge(self, other: DraftTree, merge: bool = True) -> int:
        """Add ``other``'s nodes below this tree's root (shared prefixes merged unless ``merge`` is
        False); returns the nodes added. Into an empty tree it is an exact copy."""
        before = len(self)
        mapped = [0]  # other's node i -> this tree's node
        for token, parent, prob in zip(other.tokens, other.parents, other.probs, strict=True):
            mapped.append(self.add(mapped[parent], token, merge=merge, prob=prob))
        return len(self) - before

    def prefix(self, n: int) -> DraftTree:
        """The first ``n`` nodes: parents come before children, so it is a tree; built best-first,
        it is the tree a budget of ``n`` would have drafted."""
        if n >= len(self.tokens):
            return self
        out = DraftTree(self.tokens[:n], self.parents[:n], self.depths[:n], self.probs[:n])
        out._index = {key: node for key, node in self._index.items() if node <= n}
        return out

    def depth(self) -> int:
        """Deepest node's depth (0 for an empty tree)."""
        return max(self.depths, default=0)

    def paths(self) -> list[list[int]]:
        """Root-to-leaf token paths (for tests)."""
        has_child = set(self.parents)
        out = []
        for i in range(1, len(self.tokens) + 1):
            if i in has_child:
                continue
            path, node = [], i
            while node:
                path.append(self.tokens[node - 1])
                node = self.parents[node - 1]
            out.append(path[::-1])
        return out


def within_vocab(tree: DraftTree, vocab_size: int) -> DraftTree:
    """``tree`` without the nodes whose token is not an id of the model's vocabulary (``< 0`` or
    ``>= vocab_size``), and without everything below them: a draft is only a guess, so dropping part
    of it never changes the output, while one bad id would fail the whole shared forward."""
    if all(0 <= t < vocab_size for t in tree.tokens):
        return tree
    out = DraftTree()
    new_of = {0: 0}  # old node -> new node (0: the root); a dropped node's subtree has no entry
    for old, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True), start=1):
        if parent in new_of and 0 <= token < vocab_size:
            new_of[old] = out.add(new_of[parent], token, merge=False, prob=tree.probs[old - 1])
            if tree._index.get((parent, token)) == old:  # the lookup a merged tree had stays
                out._index[(new_of[parent], token)] = new_of[old]
    return out


def ancestor_matrix(parents: list[int]) -> np.ndarray:
    """anc[i, j] = node j is node i or one of its ancestors; node 0 is the root.

    ``parents[k]`` is the parent of node k+1 and is always < k+1.
    """
    q = len(parents) + 1
    anc = np.zeros((q, q), dtype=bool)  # anc: [q, q]
    anc[0, 0] = True
    for i, parent in enumerate(parents, start=1):
        anc[i] = anc[parent]
        anc[i, i] = True
    return anc


# (full context ids, budget, max depth) -> draft tree; replaces trie drafting when given (tests feed
# adversarial trees through it)
Drafter = Callable[[list[int], int, int], DraftTree]


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
