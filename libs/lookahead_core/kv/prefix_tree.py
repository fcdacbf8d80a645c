"""Pure functions of the prefix KV cache: matching token ids, where a new entry attaches, which entries go.

The cache (prefix_cache.py) keeps each tenant's prompts as a tree of *entries*. An entry holds the KV and
the token ids of one stored prompt from its ``start`` on; the tokens before ``start`` are its parent's
(and the parent's parents'), shared with every other entry attached there. So two prompts that share the
system prompt and the same retrieved chunks, and differ only in the question, hold that shared part once,
KV and ids alike.

The tree is also the match index (a radix tree whose edges are the entries' own ids): a match walks from
the tenant's root for the query's first tokens down one child at a time (``common_prefix`` along each
entry's ids; a child is found by the position it attaches at and its first token), so it costs the query's
length, whatever the tenant holds, and adding or removing an entry changes one slot of its parent.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable, Mapping, Sequence
from types import MappingProxyType

import numpy as np


def as_ids(ids: Sequence[int]) -> np.ndarray:
    """Token ids as a flat int64 array."""
    return np.asarray(ids, dtype=np.int64).reshape(-1)  # [n]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])  # [positions that differ]
    return int(differ[0]) if differ.size else n


def attach_point(chain: Sequence[tuple[int, int]], shared: int) -> int | None:
    """The key of the entry a new prompt sharing ``shared`` tokens with the last entry of ``chain`` attaches to.

    ``chain``: (key, start) from that entry up to its root (start 0), the entry whose tokens match. The new
    entry attaches to the deepest one holding token ``shared - 1`` (start < shared), so its parents hold
    exactly tokens [0, shared) of it. None when nothing is shared.
    """
    for key, start in chain:
        if start < shared:
            return key
    return None


def pieces_of(chain: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int, int]]:
    """Which entries hold tokens [0, n) of the last entry of ``chain``, in token order.

    ``chain``: (key, start) from that entry up to its root (start 0). Returns (key, start, length): the
    entry's tokens [start, start + length) are its first ``length`` KV rows.
    """
    pieces: list[tuple[int, int, int]] = []
    end = n
    for key, start in chain:
        if end > start:
            pieces.append((key, start, end - start))
            end = start
    return pieces[::-1]


def eviction_victims(lru: Iterable[tuple[int, str, int]], tenant: str, tenant_bytes: int, max_bytes: int,
                     pinned: Container[int] = (), parents: Mapping[int, int] = MappingProxyType({})) -> list[int]:
    """Keys to evict, in order, once ``tenant`` has stored an entry, or [] when no allowed eviction makes
    both budgets hold (the caller then drops the new entry and keeps everything that was there).

    ``lru``: every entry as (key, owner, bytes), least recently used first; ``parents``: child key ->
    the key of the entry it attaches to (same owner). Only leaves go: an entry others attach to, or one
    in ``pinned`` (the new entry), is never chosen, though its bytes count; once its last child goes it is
    a leaf like the others, in its place in ``lru``.

    First ``tenant``'s own least recently used leaves while it holds more than ``tenant_bytes``; then,
    while all entries hold more than ``max_bytes``, a leaf of the owner holding the most bytes (ties: the
    owner seen first in ``lru``). When that owner has no leaf left to give (its bytes are pinned: the
    new entry and the entries it attaches to), nothing goes: a tenant never flushes one that holds less.
    """
    held: dict[str, int] = {}  # owner -> bytes, in the order owners are first seen
    owner_of: dict[int, str] = {}
    sizes: dict[int, int] = {}
    rank: dict[int, int] = {}  # key -> its place in lru (0: least recent)
    for at, (key, owner, nbytes) in enumerate(lru):
        held[owner] = held.get(owner, 0) + nbytes
        owner_of[key], sizes[key], rank[key] = owner, nbytes, at
    children: dict[int, int] = {}  # key -> live entries attached to it
    for child, parent in parents.items():
        if child in rank:
            children[parent] = children.get(parent, 0) + 1
    leaves: dict[str, list[tuple[int, int]]] = {}  # owner -> heap of its evictable (rank, key)
    for key in rank:
        if key not in pinned and not children.get(key):
            leaves.setdefault(owner_of[key], []).append((rank[key], key))
    for heap in leaves.values():
        heapq.heapify(heap)
    total = sum(held.values())
    victims: list[int] = []

    def evict(owner: str) -> None:
        nonlocal total
        _, key = heapq.heappop(leaves[owner])
        held[owner] -= sizes[key]
        total -= sizes[key]
        victims.append(key)
        parent = parents.get(key)
        if parent is not None and parent in children:
            children[parent] -= 1
            if not children[parent] and parent not in pinned:  # a leaf now
                heapq.heappush(leaves[owner], (rank[parent], parent))

    while held.get(tenant, 0) > tenant_bytes:
        if not leaves.get(tenant):
            return []
        evict(tenant)
    while total > max_bytes:
        heaviest = max(held, key=held.__getitem__)
        if not leaves.get(heaviest):
            return []
        evict(heaviest)
    return victims
