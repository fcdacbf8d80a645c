"""What an unbounded per-tenant prefix cache would reuse: each prompt's longest common prefix with an earlier one.

The engine's prefix cache (lookahead_core/kv/prefix_cache.py) reuses the KV of the longest prefix a
new prompt shares with any prompt of the same tenant it has cached, and always computes the prompt's
last token itself (its logits give the first answer token). Here nothing is ever evicted: the hit of
prompt i is the longest prefix it shares with any earlier prompt of its tenant, at most its length
minus one. Pure Python: a token trie per tenant, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

Node = dict[int, "Node"]  # token id -> the trie node after it


class PrefixTrie:
    """Every prompt seen so far, one trie per tenant."""

    def __init__(self) -> None:
        self._roots: dict[str, Node] = {}

    def add(self, tenant: str, ids: Sequence[int]) -> int:
        """Store ``ids`` for ``tenant``; returns the tokens it shares with the tenant's earlier prompts
        (the longest common prefix, at most ``len(ids) - 1``)."""
        node = self._roots.setdefault(tenant, {})
        shared = 0
        for token in ids:
            nxt = node.get(token)
            if nxt is None:
                break
            node, shared = nxt, shared + 1
        for token in ids[shared:]:
            node = node.setdefault(token, {})
        return min(shared, max(len(ids) - 1, 0))


def prefix_hits(prompts: Sequence[tuple[str, Sequence[int]]]) -> list[int]:
    """For (tenant, prompt ids) in arrival order: the prefix-cache hit of each (see the module docstring)."""
    trie = PrefixTrie()
    return [trie.add(tenant, ids) for tenant, ids in prompts]
