"""A step's draft tree (``DraftTree``: tokens, parents, path probabilities), what is done to one
before it is packed (``within_vocab``, ``ancestor_matrix``: the tree attention mask) and the ``Drafter``
hook. Drafting from the request's token trie lives with its proposer (``proposers/trie.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


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
