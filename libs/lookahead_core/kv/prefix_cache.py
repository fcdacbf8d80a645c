"""Per-tenant prefix KV cache: the KV of past prompts, reused for the longest shared token prefix.

Attention is causal, so the KV of the first k tokens of any stored sequence is valid for every
sequence that starts with the same k tokens: a lookup may return a partial prefix of an entry.
The engine ``put``s a prompt's KV after its prefill and ``lookup``s a new prompt before its own,
prefilling only the tokens past the match (chat template, system prompt, the same retrieved chunks
in the same order, an exact repeat).

Structure: a tree of entries per tenant (prefix_tree.py). A prompt sharing at least ``min_tokens`` with
a stored one keeps only the KV and the token ids past the shared part and points at the entry holding the
rest; so the shared part (the system prompt and retrieved chunks before a question) is held once however
many prompts continue it. The tree is its own match index: a lookup walks from the tenant's root for the
query's first ``min_tokens`` ids down the entries' ids (work in the query's length, never in the tenant's
entries; an add or a removal changes one slot of the parent, nothing is rebuilt) and returns
the pieces (views) its tokens are held in. Entries never cover each other: a new prompt that continues a
stored one attaches at that one's end (its KV is not held twice), and a prompt that a stored entry
continues stores nothing.

Budgets are per tenant and in all (``eviction_victims``), in bytes of KV and token ids (an entry's Python
objects, a few hundred bytes beside at least ``min_tokens`` tokens of KV, are not counted): a tenant holds
at most ``tenant_share`` of ``max_bytes`` and past it evicts its own least recently used entries; past
``max_bytes`` in all, the tenant holding the most bytes gives up its least recently used entry. Only leaves
go (an entry others attach to stays while they do). When the heaviest tenant is the one storing and its
bytes are all pinned (the new entry and the entries it attaches to), the new entry is not kept and nothing
is evicted: a tenant filling the cache flushes only its own prefixes, never those of a tenant holding less.
One lock guards everything but the epochs, which are read without it.

Isolation is by construction: a lookup only ever compares against, and returns, the entries of the tenant
it is given, and entries attach only to their own tenant's.

Forgetting: ``forget_tenant`` drops a tenant's entries and advances its *epoch*. A request reads
``epoch(tenant)`` before its prompt is built and hands it to ``put``: a put from a request whose prompt
was built before the forget (stale epoch) stores nothing, so a forget is never undone by a prefill
that overlapped it. ``epoch`` takes no lock (the generator reads it on its event loop, which must not
wait while the engine's thread stores or matches): one dict read, which ``forget_tenant`` writes under
the lock before it drops anything, so a put that compares after the forget sees the new epoch.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .kvstore import KV, Pieces
from .prefix_tree import as_ids, attach_point, common_prefix, eviction_victims, pieces_of

SEQ_DIM = -2  # token axis of a KV tensor [1, kv_heads, n, head_dim]
KV_RANK = 4  # dimensions of a KV tensor


@dataclass(frozen=True)
class PrefixCacheConfig:
    """Bounds of the prefix KV cache."""

    max_bytes: int = 1 << 30  # KV and token-id bytes kept over all tenants; past it the heaviest tenant's LRU leaf goes
    min_tokens: int = 16  # shorter matches: no hit (report 0), no shared parent; shorter prompts: not stored
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

    entries: int  # live entries over all tenants (those others attach to included)
    bytes: int  # KV and token-id bytes of the live entries (a shared part counted once)
    lookups: int  # lookup calls
    hits: int  # lookups that returned n > 0
    hit_tokens: int  # sum of n returned by lookups (tokens not prefilled again)
    evictions: int  # entries dropped to stay within the budgets (dropped tenants not counted)


@dataclass
class _Entry:
    tenant: str  # owner; never matched for another tenant
    ids: np.ndarray  # token ids [start, n) of the prompt, the tokens this entry holds: [n - start] int64
    start: int  # first token whose KV and id this entry holds; tokens before it are its parent's
    parent: int | None  # key of the entry holding token start - 1; None when start == 0
    kv: KV  # per layer (keys, values): [1, kv_heads, n - start, head_dim]
    nbytes: int  # element_size * numel over all layer tensors, plus the ids' bytes
    children: dict[tuple[int, int], int] = field(default_factory=dict)  # (start, first id) -> key of a child

    @property
    def end(self) -> int:
        """One past the last token this entry holds (its prompt's length)."""
        return self.start + len(self.ids)


def kv_nbytes(kv: KV, start: int, end: int) -> int:
    """Bytes of tokens [start, end) of every layer tensor (element_size * numel of the slice)."""
    total = 0
    for keys, values in kv:
        for t in (keys, values):
            total += t.element_size() * t[..., start:end, :].numel()
    return total


def check_kv(kv: KV, n: int) -> None:
    """Raise ValueError unless every layer tensor is [1, kv_heads, >= n, head_dim]."""
    if not kv:
        raise ValueError("kv has no layers")
    for layer, (keys, values) in enumerate(kv):
        for t in (keys, values):
            if t.dim() != KV_RANK or t.shape[SEQ_DIM] < n:
                raise ValueError(f"layer {layer}: want [1, kv_heads, >= {n}, head_dim], got {tuple(t.shape)}")


def keep_range(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Tokens [start, end) of ``t``, copied only when a view would pin a larger storage.

    A view of a longer cache keeps the whole storage alive, which ``max_bytes`` would not see.
    """
    kept = t[..., start:end, :]  # [1, kv_heads, end - start, head_dim]
    if t.untyped_storage().nbytes() > kept.numel() * kept.element_size():
        kept = kept.clone()
    return kept


def view_prefix(kv: KV, n: int) -> KV:
    """Per-layer views of the first ``n`` tokens (no copy)."""
    return [(k[..., :n, :], v[..., :n, :]) for k, v in kv]  # each [1, kv_heads, n, head_dim]


class PrefixKVCache:
    """Per-tenant prefix KV cache with per-tenant and total LRU byte budgets; thread safe (one lock)."""

    def __init__(self, config: PrefixCacheConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU first
        self._tenants: dict[str, dict[int, None]] = {}  # entry keys per tenant, in the order stored
        self._roots: dict[str, dict[bytes, int]] = {}  # per tenant: a root's first min_tokens ids -> its key
        self._held: dict[str, int] = {}  # KV and id bytes per tenant
        self._epochs: dict[str, int] = {}  # forgets per tenant (absent: 0); a put with an older epoch stores nothing
        self._next_key = itertools.count()
        self.stores = 0  # entries stored so far: a waiting prompt's best hit can only grow when this does
        self._bytes = 0
        self._lookups = 0
        self._hits = 0
        self._hit_tokens = 0
        self._evictions = 0

    def lookup(self, tenant: str, ids: Sequence[int], max_tokens: int | None = None) -> tuple[int, Pieces | None]:
        """Longest n <= min(len(ids), max_tokens) such that ids[:n] prefixes a stored sequence of ``tenant``.

        Returns (n, the views of the stored tensors holding tokens [0, n), as ``Pieces``) and marks the
        entries used, or (0, None) when n < ``min_tokens``. The caller copies from the views, never writes
        into them.
        """
        query = as_ids(ids)
        if max_tokens is not None:
            query = query[: max(max_tokens, 0)]
        with self._lock:
            self._lookups += 1
            key, n = self._best_match(tenant, query)
            if key is None or n < self.config.min_tokens:
                return 0, None
            chain = self._chain(key)
            self._touch(chain)
            self._hits += 1
            self._hit_tokens += n
            return n, [(start, view_prefix(self._entries[k].kv, length))
                       for k, start, length in pieces_of(chain, n)]

    def put(self, tenant: str, ids: Sequence[int], kv: KV, epoch: int | None = None) -> None:
        """Store the KV of ``ids`` (each layer tensor [1, kv_heads, >= len(ids), head_dim]).

        The cache keeps slices of the given tensors (copied when a slice would pin a larger storage): the
        caller must not write into them afterwards. Only the tokens past the longest part shared with a
        stored entry are kept when that part is ``min_tokens`` or more; if ``ids`` is a prefix of a stored
        entry nothing is stored and that entry is touched. Sequences shorter than ``min_tokens``, and
        entries that cannot fit the budgets beside the entries they attach to, are not stored. Entries are
        evicted to fit (``eviction_victims``). ``epoch``: the tenant's ``epoch()`` when the prompt was
        built; a stale one (the tenant was forgotten since) stores nothing (None: no check).
        """
        seq = as_ids(ids)
        n = len(seq)
        check_kv(kv, n)
        if n < self.config.min_tokens:
            return
        with self._lock:
            if epoch is not None and epoch != self._epochs.get(tenant, 0):
                return
            key, shared = self._best_match(tenant, seq)
            chain = self._chain(key) if key is not None else []
            if shared == n:
                self._touch(chain)
                return
            parent = attach_point(chain, shared) if shared >= self.config.min_tokens else None
            start = shared if parent is not None else 0
            own = seq[start:].copy()  # [n - start]: not a view, which would keep the whole prompt's ids
            nbytes = kv_nbytes(kv, start, n) + own.nbytes
            if nbytes > self.config.tenant_bytes:
                return
            new = next(self._next_key)
            # each [1, kv_heads, n - start, head_dim]
            kept = [(keep_range(k, start, n), keep_range(v, start, n)) for k, v in kv]
            self._add(new, _Entry(tenant, own, start, parent, kept, nbytes))
            if parent is not None:
                self._touch(self._chain(parent))
            if not self._fit(tenant, new):  # no room but a lighter tenant's or its own pinned: keep what was there
                self._remove(new)
                return
            self.stores += 1

    def epoch(self, tenant: str) -> int:
        """How often ``tenant`` was forgotten: read it before building a prompt, give it to ``put``. Never
        waits on the lock (one dict read; ``forget_tenant`` advances it under the lock)."""
        return self._epochs.get(tenant, 0)

    def forget_tenant(self, tenant: str) -> int:
        """Drop every entry of ``tenant`` and advance its epoch (puts of prompts built before now store
        nothing); returns how many entries were dropped."""
        with self._lock:
            self._epochs[tenant] = self._epochs.get(tenant, 0) + 1
            keys = list(self._tenants.get(tenant, ()))
            for key in reversed(keys):  # children were stored after their parents
                self._remove(key)
            return len(keys)

    def sequences(self, tenant: str) -> list[tuple[int, ...]]:
        """Token ids of the live prompts of ``tenant``: every entry but those another entry continues at
        their end (a snapshot, for inspection and tests)."""
        with self._lock:
            live = []
            for key in self._tenants.get(tenant, ()):
                entry = self._entries[key]
                if all(at < entry.end for at, _ in entry.children):
                    pieces = pieces_of(self._chain(key), entry.end)
                    live.append(tuple(np.concatenate([self._entries[k].ids[:length]
                                                      for k, _, length in pieces]).tolist()))
            return live

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
        """(key of an entry sharing the longest prefix with ``query``, that length), when it is ``min_tokens``
        or more; (None, 0) otherwise. Walks the tenant's tree from the root for the query's first
        ``min_tokens`` ids: at most one child of each entry can go on matching (the one attached where the
        match stopped, starting with the query's next id), so the work is the query's length."""
        first = self.config.min_tokens
        roots = self._roots.get(tenant)
        if not roots or len(query) < first:
            return None, 0
        key = roots.get(query[:first].tobytes())
        if key is None:
            return None, 0
        while True:
            entry = self._entries[key]
            shared = entry.start + common_prefix(entry.ids, query[entry.start:])
            child = entry.children.get((shared, int(query[shared]))) if shared < len(query) else None
            if child is None:
                return key, shared
            key = child

    def _chain(self, key: int) -> list[tuple[int, int]]:
        """(key, start) of an entry and each of its parents, up to the root."""
        chain: list[tuple[int, int]] = []
        at: int | None = key
        while at is not None:
            entry = self._entries[at]
            chain.append((at, entry.start))
            at = entry.parent
        return chain

    def _touch(self, chain: list[tuple[int, int]]) -> None:
        for key, _ in chain:
            self._entries.move_to_end(key)

    def _over(self, tenant: str) -> bool:
        return self._held.get(tenant, 0) > self.config.tenant_bytes or self._bytes > self.config.max_bytes

    def _fit(self, tenant: str, new: int) -> bool:
        """Evict least recently used leaves until both budgets hold with ``new`` stored; False, having evicted
        nothing, when they cannot (``eviction_victims``: only ``tenant``'s own past its share, only the
        heaviest owner's past the total, never a pinned entry)."""
        if not self._over(tenant):
            return True
        lru = [(k, e.tenant, e.nbytes) for k, e in self._entries.items()]
        parents = {k: e.parent for k, e in self._entries.items() if e.parent is not None}
        victims = eviction_victims(lru, tenant, self.config.tenant_bytes, self.config.max_bytes, {new}, parents)
        for victim in victims:
            self._remove(victim)
            self._evictions += 1
        return bool(victims)

    def _add(self, key: int, entry: _Entry) -> None:
        self._entries[key] = entry
        self._tenants.setdefault(entry.tenant, {})[key] = None
        self._held[entry.tenant] = self._held.get(entry.tenant, 0) + entry.nbytes
        self._bytes += entry.nbytes
        if entry.parent is not None:
            self._entries[entry.parent].children[entry.start, int(entry.ids[0])] = key
        else:
            self._roots.setdefault(entry.tenant, {})[entry.ids[: self.config.min_tokens].tobytes()] = key

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        self._held[entry.tenant] -= entry.nbytes
        keys = self._tenants[entry.tenant]
        del keys[key]
        if entry.parent is None:
            del self._roots[entry.tenant][entry.ids[: self.config.min_tokens].tobytes()]
        elif entry.parent in self._entries:
            del self._entries[entry.parent].children[entry.start, int(entry.ids[0])]
        if not keys:
            del self._tenants[entry.tenant]
            del self._held[entry.tenant]
            del self._roots[entry.tenant]
