"""Per-tenant prefix KV cache: the KV of past prompts, reused for the longest shared token prefix.

Attention is causal, so the KV of the first k tokens of any stored sequence is valid for every
sequence that starts with the same k tokens: a lookup may return a partial prefix of an entry.
The engine ``put``s a prompt's KV after its prefill and ``lookup``s a new prompt before its own,
prefilling only the tokens past the match (chat template, system prompt, the same retrieved chunks
in the same order, an exact repeat).

Structure: a flat list of entries per tenant, matched with one vectorized numpy comparison rather
than a token radix tree. Each tenant's token ids are kept as a padded matrix [entries, width],
rebuilt lazily after a put or removal, and a lookup is one ``matrix[:, :m] != ids[:m]`` plus an
argmax per row: a few hundred entries of a few hundred tokens is ~1e5 int compares in C (~0.1 ms
for 300 x 300 on one busy CPU core), far below one forward, with no node bookkeeping to keep consistent on eviction. A
radix tree would only pay off for many thousands of entries, which ``max_bytes`` of KV rules out.
Entries never cover each other (a stored prefix of a new entry is dropped, a new prefix of a stored
entry is not stored), so the list holds no redundant KV.

Isolation is by construction: a lookup only ever compares against, and returns, the entries of the
tenant it is given. Budgets are per tenant too (``eviction_victims``): a tenant holds at most
``tenant_share`` of ``max_bytes`` and past it evicts its own least recently used entries; past
``max_bytes`` in all, the tenant holding the most bytes gives up its least recently used entry. So a
tenant filling the cache flushes only its own prefixes, and how long a tenant's entry lives depends on
others' volume only when the shares add up to more than the whole. One lock guards everything.

Forgetting: ``forget_tenant`` drops a tenant's entries and advances its *epoch*. A request reads
``epoch(tenant)`` before its prompt is built and hands it to ``put``: a put from a request whose prompt
was built before the forget (stale epoch) stores nothing, so a forget is never undone by a prefill
that overlapped it.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values): [1, kv_heads, n, head_dim]

SEQ_DIM = -2  # token axis of a KV tensor [1, kv_heads, n, head_dim]
KV_RANK = 4  # dimensions of a KV tensor


@dataclass(frozen=True)
class PrefixCacheConfig:
    """Bounds of the prefix KV cache."""

    max_bytes: int = 1 << 30  # total KV bytes kept over all tenants; past it the heaviest tenant's LRU entry goes
    min_tokens: int = 16  # shorter matches are not worth a lookup hit (report 0); shorter prompts are not stored
    tenant_share: float = 1.0  # fraction of max_bytes one tenant may hold; past it its own LRU entries go

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if self.min_tokens < 1:
            raise ValueError("min_tokens must be >= 1")
        if not 0.0 < self.tenant_share <= 1.0:
            raise ValueError("tenant_share must be in (0, 1]")

    @property
    def tenant_bytes(self) -> int:
        """KV bytes one tenant may hold."""
        return int(self.max_bytes * self.tenant_share)


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters of one cache (a snapshot)."""

    entries: int  # live entries over all tenants
    bytes: int  # KV bytes of the live entries
    lookups: int  # lookup calls
    hits: int  # lookups that returned n > 0
    hit_tokens: int  # sum of n returned by lookups (tokens not prefilled again)
    evictions: int  # entries dropped to stay within the budgets (covered and dropped tenants not counted)


@dataclass
class _Entry:
    tenant: str  # owner; never matched for another tenant
    ids: np.ndarray  # token ids: [n] int64
    kv: KV  # per layer (keys, values): [1, kv_heads, n, head_dim]
    nbytes: int  # element_size * numel over all layer tensors


@dataclass
class _Index:
    keys: list[int]  # entry keys, one per row
    rows: np.ndarray  # token ids padded with 0: [entries, width] int64
    lengths: np.ndarray  # tokens per entry: [entries] int64


# ---- pure functions ------------------------------------------------------------------------------
def as_ids(ids: Sequence[int]) -> np.ndarray:
    """Token ids as a flat int64 array."""
    return np.asarray(ids, dtype=np.int64).reshape(-1)  # [n]


def kv_nbytes(kv: KV, n: int) -> int:
    """Bytes of the first ``n`` tokens of every layer tensor (element_size * numel of the slice)."""
    total = 0
    for keys, values in kv:
        for t in (keys, values):
            total += t.element_size() * t[..., :n, :].numel()
    return total


def check_kv(kv: KV, n: int) -> None:
    """Raise ValueError unless every layer tensor is [1, kv_heads, >= n, head_dim]."""
    if not kv:
        raise ValueError("kv has no layers")
    for layer, (keys, values) in enumerate(kv):
        for t in (keys, values):
            if t.dim() != KV_RANK or t.shape[SEQ_DIM] < n:
                raise ValueError(f"layer {layer}: want [1, kv_heads, >= {n}, head_dim], got {tuple(t.shape)}")


def keep_prefix(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` tokens of ``t``, copied only when a view would pin a larger storage.

    A view of a longer cache keeps the whole storage alive, which ``max_bytes`` would not see.
    """
    kept = t[..., :n, :]  # [1, kv_heads, n, head_dim]
    if t.untyped_storage().nbytes() > kept.numel() * kept.element_size():
        kept = kept.clone()
    return kept


def view_prefix(kv: KV, n: int) -> KV:
    """Per-layer views of the first ``n`` tokens (no copy)."""
    return [(k[..., :n, :], v[..., :n, :]) for k, v in kv]  # each [1, kv_heads, n, head_dim]


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


def eviction_victims(lru: Iterable[tuple[int, str, int]], tenant: str, tenant_bytes: int, max_bytes: int,
                     keep: int | None = None) -> list[int]:
    """Keys to evict, in order, once ``tenant`` has stored an entry: ``lru`` is every entry as
    (key, owner, bytes), least recently used first; ``keep`` (the new entry) is never chosen.

    First ``tenant``'s own least recently used entries while it holds more than ``tenant_bytes``;
    then, while all entries hold more than ``max_bytes``, the least recently used entry of the owner
    holding the most bytes (ties: the owner seen first in ``lru``). Another tenant's entries go only
    for the total budget, and only while that tenant holds at least as much as every other.
    """
    held: dict[str, int] = {}  # owner -> bytes
    queues: dict[str, deque[tuple[int, int]]] = {}  # owner -> its evictable (key, bytes), LRU first
    for key, owner, nbytes in lru:
        held[owner] = held.get(owner, 0) + nbytes
        if key != keep:
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


# ---- the cache -----------------------------------------------------------------------------------
class PrefixKVCache:
    """Per-tenant prefix KV cache with per-tenant and total LRU byte budgets; thread safe (one lock)."""

    def __init__(self, config: PrefixCacheConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU first
        self._tenants: dict[str, list[int]] = {}  # entry keys per tenant
        self._index: dict[str, _Index] = {}  # lazily rebuilt match matrices per tenant
        self._epochs: dict[str, int] = {}  # forgets per tenant (absent: 0); a put with an older epoch stores nothing
        self._next_key = itertools.count()
        self.stores = 0  # entries stored so far: a waiting prompt's best hit can only grow when this does
        self._bytes = 0
        self._lookups = 0
        self._hits = 0
        self._hit_tokens = 0
        self._evictions = 0

    def lookup(self, tenant: str, ids: Sequence[int], max_tokens: int | None = None) -> tuple[int, KV | None]:
        """Longest n <= min(len(ids), max_tokens) such that ids[:n] prefixes a stored sequence of ``tenant``.

        Returns (n, per-layer views ``[..., :n, :]`` of the stored tensors) and marks the entry used,
        or (0, None) when n < ``min_tokens``. The caller copies from the views, never writes into them.
        """
        query = as_ids(ids)
        if max_tokens is not None:
            query = query[: max(max_tokens, 0)]
        with self._lock:
            self._lookups += 1
            key, n = self._best_match(tenant, query)
            if key is None or n < self.config.min_tokens:
                return 0, None
            self._entries.move_to_end(key)
            self._hits += 1
            self._hit_tokens += n
            return n, view_prefix(self._entries[key].kv, n)

    def put(self, tenant: str, ids: Sequence[int], kv: KV, epoch: int | None = None) -> None:
        """Store the KV of ``ids`` (each layer tensor [1, kv_heads, >= len(ids), head_dim]).

        The cache keeps the given tensors sliced to len(ids) (copied only when the slice would pin a
        larger storage): the caller must not write into them afterwards. Stored entries that are a
        prefix of ``ids`` are dropped; if ``ids`` is a prefix of a stored entry nothing is stored
        and that entry is touched. Sequences shorter than ``min_tokens`` and entries alone larger
        than the tenant's budget are not stored. Entries are evicted to fit (``eviction_victims``). ``epoch``:
        the tenant's ``epoch()`` when the prompt was built; a stale one (the tenant was forgotten
        since) stores nothing (None: no check).
        """
        seq = as_ids(ids)
        n = len(seq)
        check_kv(kv, n)
        nbytes = kv_nbytes(kv, n)
        if n < self.config.min_tokens or nbytes > self.config.tenant_bytes:
            return
        with self._lock:
            if epoch is not None and epoch != self._epochs.get(tenant, 0):
                return
            index = self._tenant_index(tenant)
            if index is not None:
                lcp = common_prefix_lengths(index.rows, index.lengths, seq)  # [entries]
                covering = np.flatnonzero(lcp == n)
                if covering.size:
                    self._entries.move_to_end(index.keys[int(covering[0])])
                    return
                for row in np.flatnonzero(lcp == index.lengths):
                    self._remove(index.keys[int(row)])
            key = next(self._next_key)
            self.stores += 1
            kept = [(keep_prefix(k, n), keep_prefix(v, n)) for k, v in kv]  # each [1, kv_heads, n, head_dim]
            self._entries[key] = _Entry(tenant, seq, kept, nbytes)
            self._tenants.setdefault(tenant, []).append(key)
            self._index.pop(tenant, None)
            self._bytes += nbytes
            lru = ((k, e.tenant, e.nbytes) for k, e in self._entries.items())
            for victim in eviction_victims(lru, tenant, self.config.tenant_bytes, self.config.max_bytes, keep=key):
                self._remove(victim)
                self._evictions += 1

    def epoch(self, tenant: str) -> int:
        """How often ``tenant`` was forgotten: read it before building a prompt, give it to ``put``."""
        with self._lock:
            return self._epochs.get(tenant, 0)

    def forget_tenant(self, tenant: str) -> int:
        """Drop every entry of ``tenant`` and advance its epoch (puts of prompts built before now store
        nothing); returns how many entries were dropped."""
        with self._lock:
            self._epochs[tenant] = self._epochs.get(tenant, 0) + 1
            keys = list(self._tenants.get(tenant, ()))
            for key in keys:
                self._remove(key)
            return len(keys)

    def sequences(self, tenant: str) -> list[tuple[int, ...]]:
        """Token ids of the live entries of ``tenant`` (a snapshot, for inspection and tests)."""
        with self._lock:
            return [tuple(self._entries[key].ids.tolist()) for key in self._tenants.get(tenant, ())]

    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return PrefixCacheStats(
                entries=len(self._entries),
                bytes=self._bytes,
                lookups=self._lookups,
                hits=self._hits,
                hit_tokens=self._hit_tokens,
                evictions=self._evictions,
            )

    # ---- under the lock ----------------------------------------------------------------------------
    def _best_match(self, tenant: str, query: np.ndarray) -> tuple[int | None, int]:
        """(key of the entry sharing the longest prefix with ``query``, that length); (None, 0) if none."""
        index = self._tenant_index(tenant)
        if index is None or len(query) == 0:
            return None, 0
        lcp = common_prefix_lengths(index.rows, index.lengths, query)  # [entries]
        best = int(lcp.argmax())
        return index.keys[best], int(lcp[best])

    def _tenant_index(self, tenant: str) -> _Index | None:
        keys = self._tenants.get(tenant)
        if not keys:
            return None
        index = self._index.get(tenant)
        if index is None:
            rows, lengths = pad_rows([self._entries[key].ids for key in keys])
            index = self._index[tenant] = _Index(list(keys), rows, lengths)
        return index

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        keys = self._tenants[entry.tenant]
        keys.remove(key)
        if not keys:
            del self._tenants[entry.tenant]
        self._index.pop(entry.tenant, None)
