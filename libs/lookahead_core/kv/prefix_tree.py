"""Pure functions of the prefix KV cache: matching token ids, where a new entry attaches, which entries go.

The cache (prefix_cache.py) keeps each tenant's prompts as a tree of *entries*. An entry holds the KV of
one stored prompt from its ``start`` on; the KV of the tokens before ``start`` is its parent's (and the
parent's parents'), shared with every other entry attached there. So two prompts that share the system
prompt and the same retrieved chunks, and differ only in the question, hold that shared part once.

Matching is over each entry's *whole* token ids (its parents' tokens included), a padded matrix and one
vectorized comparison (``common_prefix_lengths``); the tree only decides whose tensors hold which tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Sequence

import numpy as np


def as_ids(ids: Sequence[int]) -> np.ndarray:
    """Token ids as a flat int64 array."""
    return np.asarray(ids, dtype=np.int64).reshape(-1)  # [n]


def pad_rows(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sequences as a zero-padded matrix [entries, width] and their lengths [entries]."""
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)  # [entries]
    width = int(lengths.max(initial=0))
    rows = np.zeros((len(seqs), width), dtype=np.int64)  # [entries, width]
    for i, s in enumerate(seqs):
        rows[i, : len(s)] = s
    return rows, lengths


def common_prefix_lengths(rows: np.ndarray, lengths: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Longest common prefix of ``query`` with each row (padding never counts): [entries] int64."""
    width = min(rows.shape[1], len(query))
    if width == 0:
        return np.zeros(len(lengths), dtype=np.int64)
    differ = rows[:, :width] != query[:width]  # [entries, width]
    lcp = np.where(differ.any(axis=1), differ.argmax(axis=1), width)  # [entries]
    return np.minimum(lcp, lengths)


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
                     pinned: Container[int] = ()) -> list[int]:
    """Keys to evict, in order, once ``tenant`` has stored an entry: ``lru`` is every entry as
    (key, owner, bytes), least recently used first; ``pinned`` keys (the new entry, entries others attach
    to) are never chosen, though their bytes count.

    First ``tenant``'s own least recently used entries while it holds more than ``tenant_bytes``;
    then, while all entries hold more than ``max_bytes``, the least recently used entry of the owner
    holding the most bytes (ties: the owner seen first in ``lru``). Another tenant's entries go only
    for the total budget, and only while that tenant holds at least as much as every other.
    """
    held: dict[str, int] = {}  # owner -> bytes
    queues: dict[str, deque[tuple[int, int]]] = {}  # owner -> its evictable (key, bytes), LRU first
    for key, owner, nbytes in lru:
        held[owner] = held.get(owner, 0) + nbytes
        if key not in pinned:
            queues.setdefault(owner, deque()).append((key, nbytes))
    total = sum(held.values())
    victims: list[int] = []

    def evict(owner: str) -> None:
        nonlocal total
        key, nbytes = queues[owner].popleft()
        if not queues[owner]:
            del queues[owner]
        held[owner] -= nbytes
        total -= nbytes
        victims.append(key)

    while held.get(tenant, 0) > tenant_bytes and tenant in queues:
        evict(tenant)
    while total > max_bytes and queues:
        evict(max(queues, key=held.__getitem__))
    return victims
