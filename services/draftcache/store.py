"""DraftCacheStore: per (tenant, tokenizer) tries of past outputs plus whole recent outputs. No gRPC.

    store = DraftCacheStore(settings)
    store.load_snapshot(path)                                   # if one was saved
    store.add_output("acme", tok_id, output_ids, event_id)     # True once per event id
    branches = store.fetch("acme", tok_id, prompt_ids, reference_ids, budget=0)  # [Branch(ids, weight)]

Also the bus's EventApplier for ``GenerationCompleted`` (``apply`` / ``snapshot`` / ``restore``).
Tenants and tokenizers never mix: each (tenant, tokenizer_id) has its own trie and outputs, and a
fetch reads only its own scope. Applied event ids are remembered per tenant (bounded) and kept in
the snapshot, so replaying the log after a restore applies nothing twice.

Thread-safety: mutations and snapshots serialize on one write lock; each scope has its own lock,
held by a mutation of that scope and by a fetch, so fetches of one tenant never wait for another
tenant's writes (the scope map is only replaced under the write lock; reads are single dict gets).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lookahead_core.trie import TokenTrie
from lookahead_rag.v1 import events_pb2

from services.common.errors import InvalidArgument, ResourceExhausted
from services.draftcache import codec
from services.draftcache.fetch import Branch, fetch_branches
from services.draftcache.persistence import read_file, write_file_atomic
from services.draftcache.references import ReferenceStore
from services.draftcache.settings import DraftCacheSettings
from services.draftcache.validate import check_budget, check_ids, check_name

log = logging.getLogger(__name__)

ScopeKey = tuple[str, str]  # (tenant, tokenizer_id)
_TRIE_BRANCH_LENGTH = struct.Struct("<q")  # first field of TokenTrie.dump_outputs()


@dataclass(frozen=True, slots=True)
class ScopeStats:
    tenant: str
    tokenizer_id: str
    nodes: int  # trie nodes
    bytes: int  # approximate memory: trie nodes + outputs kept whole + their index
    outputs: int  # outputs inserted into the trie (pruning does not lower it)
    references: int  # distinct outputs kept whole


@dataclass
class _Scope:
    trie: TokenTrie
    refs: ReferenceStore
    lock: threading.Lock = field(default_factory=threading.Lock)


class DraftCacheStore:
    """The draft cache's state and its EventApplier. Thread-safe."""

    def __init__(self, settings: DraftCacheSettings) -> None:
        self.settings = settings
        self._trie_config = settings.trie_config()
        self._scopes: dict[ScopeKey, _Scope] = {}
        self._applied: dict[str, OrderedDict[str, None]] = {}  # tenant -> event ids, oldest first
        self._write_lock = threading.RLock()
        self.changes = 0  # bumped by every applied change (persistence saves when it moved)
        self.saved_changes = 0  # ``changes`` at the last save/load (an empty new store needs no file)

    # ---- scopes ------------------------------------------------------------------------------
    def _new_scope(self) -> _Scope:
        s = self.settings
        refs = ReferenceStore(
            s.max_references, s.similarity_ngram, s.max_reference_tokens, s.max_ngram_outputs
        )
        return _Scope(TokenTrie(self._trie_config), refs)

    def _scope_for_write(self, tenant: str, tokenizer_id: str) -> _Scope:
        """The scope, created if needed within the tenant/tokenizer limits (caller holds the write lock)."""
        key = (tenant, tokenizer_id)
        scope = self._scopes.get(key)
        if scope is not None:
            return scope
        tenants = {t for t, _ in self._scopes}
        if tenant not in tenants and len(tenants) >= self.settings.max_tenants:
            raise ResourceExhausted(f"draft cache holds {len(tenants)} tenants already (max_tenants)")
        tokenizers = sum(1 for t, _ in self._scopes if t == tenant)
        if tokenizers >= self.settings.max_tokenizers_per_tenant:
            raise ResourceExhausted(
                f"tenant {tenant!r} has {tokenizers} tokenizers already (max_tokenizers_per_tenant)"
            )
        scope = self._scopes[key] = self._new_scope()
        return scope

    def _remember(self, tenant: str, event_id: str) -> None:
        seen = self._applied.setdefault(tenant, OrderedDict())
        seen[event_id] = None
        while len(seen) > self.settings.max_event_ids:
            seen.popitem(last=False)

    # ---- writes ------------------------------------------------------------------------------
    def add_output(self, tenant: str, tokenizer_id: str, output_ids: Sequence[int], event_id: str) -> bool:
        """Insert one finished output; False (nothing changed) when ``event_id`` was applied before."""
        s = self.settings
        check_name("tenant", tenant, s.max_name_chars)
        check_name("tokenizer_id", tokenizer_id, s.max_name_chars)
        check_name("event_id", event_id, s.max_name_chars)
        ids = check_ids("output_ids", output_ids, s.max_request_ids)
        with self._write_lock:
            if event_id in self._applied.get(tenant, ()):
                return False
            scope = self._scope_for_write(tenant, tokenizer_id)
            with scope.lock:
                scope.trie.insert_output(ids)
                scope.refs.add(ids)
            self._remember(tenant, event_id)
            self.changes += 1
            return True

    def apply(self, event: events_pb2.GenerationCompleted) -> bool:
        """EventApplier: insert the event's output; False when its event_id was applied before."""
        return self.add_output(event.tenant, event.tokenizer_id, event.output_ids, event.event_id)

    # ---- reads -------------------------------------------------------------------------------
    def fetch(
        self,
        tenant: str,
        tokenizer_id: str,
        prompt_ids: Sequence[int],
        reference_ids: Sequence[int] = (),
        budget: int = 0,
    ) -> list[Branch]:
        """The request-scoped branches of this tenant's past outputs (see services.draftcache.fetch).

        ``budget`` = max total tokens (0: the default). An unknown tenant or tokenizer gets [].
        """
        s = self.settings
        check_name("tenant", tenant, s.max_name_chars)
        check_name("tokenizer_id", tokenizer_id, s.max_name_chars)
        budget = check_budget(budget, s.default_budget, s.max_budget)
        if len(prompt_ids) + len(reference_ids) > s.max_request_ids:
            total = len(prompt_ids) + len(reference_ids)
            raise InvalidArgument(f"prompt_ids + reference_ids has {total} ids; at most {s.max_request_ids}")
        prompt = check_ids("prompt_ids", prompt_ids, s.max_request_ids)
        references = check_ids("reference_ids", reference_ids, s.max_request_ids)
        scope = self._scopes.get((tenant, tokenizer_id))
        if scope is None:
            return []
        with scope.lock:
            return fetch_branches(scope.trie, scope.refs, prompt, references, budget, s)

    def stats(self, tenant: str = "") -> list[ScopeStats]:
        """Per-scope sizes of ``tenant`` (every tenant when empty), sorted by (tenant, tokenizer)."""
        out = []
        for (t, tok), scope in sorted(self._scopes.items()):
            if tenant and t != tenant:
                continue
            with scope.lock:
                trie, refs = scope.trie, scope.refs
                nbytes = trie.nbytes() + refs.nbytes()
                out.append(ScopeStats(t, tok, trie.node_count, nbytes, trie.outputs_inserted, len(refs)))
        return out

    def tenants(self) -> list[str]:
        return sorted({t for t, _ in self._scopes})

    # ---- snapshot ----------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """EventApplier: every scope's trie and whole outputs plus the applied event ids."""
        with self._write_lock:
            state = codec.StoreState(applied={t: list(ids) for t, ids in self._applied.items()})
            for (tenant, tok), scope in self._scopes.items():
                with scope.lock:
                    state.scopes.append(
                        codec.ScopeState(tenant, tok, scope.trie.dump_outputs(), scope.refs.items())
                    )
            return codec.encode(state)

    def restore(self, data: bytes) -> None:
        """EventApplier: replace the whole state with a snapshot's (raises SnapshotError, state kept)."""
        state = codec.decode(data)
        scopes: dict[ScopeKey, _Scope] = {}
        for saved in state.scopes:
            scope = self._new_scope()
            scope.trie = self._load_trie(saved.trie)
            for ids, count in saved.outputs:
                scope.refs.add(ids, count)
            scopes[(saved.tenant, saved.tokenizer_id)] = scope
        applied = {t: OrderedDict.fromkeys(ids) for t, ids in state.applied.items()}
        with self._write_lock:
            self._scopes = scopes
            self._applied = applied
            self.changes += 1

    def _load_trie(self, data: bytes) -> TokenTrie:
        try:
            (saved_length,) = _TRIE_BRANCH_LENGTH.unpack_from(data, 0)
            trie = TokenTrie.load_outputs(data, self._trie_config)
        except (struct.error, KeyError, IndexError) as exc:
            raise codec.SnapshotError(f"damaged trie in snapshot: {exc!r}") from exc
        configured = self._trie_config.branch_length
        if saved_length != configured:
            raise codec.SnapshotError(f"snapshot branch_length {saved_length}; configured {configured}")
        trie.maybe_prune()  # the configured capacity may be lower than when it was saved
        return trie

    def save_snapshot(self, path: Path) -> int:
        """Write ``snapshot()`` to ``path`` atomically (temp + fsync + rename); returns its size."""
        changes = self.changes
        size = write_file_atomic(path, self.snapshot())
        self.saved_changes = changes
        log.info("draft cache snapshot: %d bytes to %s", size, path)
        return size

    def load_snapshot(self, path: Path) -> bool:
        """Restore from ``path`` when it exists; False when there is none."""
        data = read_file(path)
        if data is None:
            return False
        self.restore(data)
        self.saved_changes = self.changes
        log.info("draft cache restored %d scopes from %s", len(self._scopes), path)
        return True
