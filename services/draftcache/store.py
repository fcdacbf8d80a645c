"""DraftCacheStore: per (tenant, tokenizer) tries of past outputs plus whole recent outputs. No gRPC.

    store = DraftCacheStore(settings)
    store.load_snapshot(path)                                   # if one was saved
    store.add_output("acme", tok_id, output_ids, event_id)     # True once per event id
    branches = store.fetch("acme", tok_id, prompt_ids, reference_ids, budget=0)  # [Branch(ids, weight)]

Also the bus's EventApplier for ``GenerationCompleted`` (``apply`` / ``snapshot`` / ``restore``).
Tenants and tokenizers never mix: each (tenant, tokenizer_id) has its own trie and outputs, and a
fetch reads only its own scope. Applied event ids are remembered per tenant (bounded) and kept in
the snapshot, so replaying the log after a restore applies nothing twice.

Thread-safety: each tenant has one lock, held by its writes, fetches, stats and its part of a
snapshot, so one tenant never waits for another's work and a snapshot never stalls every writer
at once; a store-wide lock only guards creating tenants and swapping state on ``restore``. Each
tenant's part of a snapshot is consistent with its applied event ids (events are per tenant).
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
from services.common.limits import RequestLimits
from services.draftcache import codec
from services.draftcache.fetch import Branch, fetch_branches
from services.draftcache.persistence import read_file, write_file_atomic
from services.draftcache.references import ReferenceStore
from services.draftcache.settings import DraftCacheSettings
from services.draftcache.validate import check_budget, check_ids, check_name

log = logging.getLogger(__name__)

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
    """One (tenant, tokenizer): the trie of output windows and the outputs kept whole."""

    trie: TokenTrie
    refs: ReferenceStore


@dataclass
class _Tenant:
    scopes: dict[str, _Scope] = field(default_factory=dict)  # tokenizer id -> scope
    applied: OrderedDict[str, None] = field(default_factory=OrderedDict)  # event ids, oldest first
    lock: threading.Lock = field(default_factory=threading.Lock)


class DraftCacheStore:
    """The draft cache's state and its EventApplier. Thread-safe."""

    def __init__(self, settings: DraftCacheSettings, limits: RequestLimits | None = None) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else RequestLimits()  # tenant rules shared by all services
        self._trie_config = settings.trie_config()
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()  # creating tenants, swapping state, the change counter
        self.changes = 0  # bumped by every applied change (persistence saves when it moved)
        self.saved_changes = 0  # ``changes`` at the last save/load (an empty new store needs no file)

    # ---- tenants and scopes --------------------------------------------------------------------
    def _new_refs(self) -> ReferenceStore:
        s = self.settings
        return ReferenceStore(s.max_references, s.similarity_ngram, s.max_reference_tokens, s.max_ngram_outputs)

    def _tenant_for_write(self, name: str) -> _Tenant:
        """The tenant, created if the tenant limit allows."""
        tenant = self._tenants.get(name)
        if tenant is not None:
            return tenant
        with self._lock:
            tenant = self._tenants.get(name)
            if tenant is None:
                if len(self._tenants) >= self.settings.max_tenants:
                    raise ResourceExhausted(f"draft cache holds {len(self._tenants)} tenants already (max_tenants)")
                tenant = self._tenants[name] = _Tenant()
            return tenant

    def _scope_for_write(self, tenant: _Tenant, name: str, tokenizer_id: str) -> _Scope:
        """The tenant's scope of ``tokenizer_id``, created if the limit allows (tenant lock held)."""
        scope = tenant.scopes.get(tokenizer_id)
        if scope is not None:
            return scope
        if len(tenant.scopes) >= self.settings.max_tokenizers_per_tenant:
            raise ResourceExhausted(
                f"tenant {name!r} has {len(tenant.scopes)} tokenizers already (max_tokenizers_per_tenant)"
            )
        scope = tenant.scopes[tokenizer_id] = _Scope(TokenTrie(self._trie_config), self._new_refs())
        return scope

    def _changed(self) -> None:
        with self._lock:
            self.changes += 1

    # ---- writes ------------------------------------------------------------------------------
    def add_output(self, tenant: str, tokenizer_id: str, output_ids: Sequence[int], event_id: str) -> bool:
        """Insert one finished output; False (nothing changed) when ``event_id`` was applied before."""
        s = self.settings
        self.limits.check_tenant(tenant)
        check_name("tokenizer_id", tokenizer_id, s.max_name_chars)
        check_name("event_id", event_id, s.max_name_chars)
        ids = check_ids("output_ids", output_ids, s.max_request_ids)
        state = self._tenant_for_write(tenant)
        with state.lock:
            if event_id in state.applied:
                return False
            scope = self._scope_for_write(state, tenant, tokenizer_id)
            scope.trie.insert_output(ids)
            scope.refs.add(ids)
            state.applied[event_id] = None
            while len(state.applied) > s.max_event_ids:
                state.applied.popitem(last=False)
        self._changed()
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
        self.limits.check_tenant(tenant)
        check_name("tokenizer_id", tokenizer_id, s.max_name_chars)
        budget = check_budget(budget, s.default_budget, s.max_budget)
        if len(prompt_ids) + len(reference_ids) > s.max_request_ids:
            total = len(prompt_ids) + len(reference_ids)
            raise InvalidArgument(f"prompt_ids + reference_ids has {total} ids; at most {s.max_request_ids}")
        prompt = check_ids("prompt_ids", prompt_ids, s.max_request_ids)
        references = check_ids("reference_ids", reference_ids, s.max_request_ids)
        state = self._tenants.get(tenant)
        if state is None:
            return []
        with state.lock:
            scope = state.scopes.get(tokenizer_id)
            if scope is None:
                return []
            return fetch_branches(scope.trie, scope.refs, prompt, references, budget, s)

    def stats(self, tenant: str = "") -> list[ScopeStats]:
        """Per-scope sizes of ``tenant`` (every tenant when empty), sorted by (tenant, tokenizer)."""
        out = []
        for name, state in self._sorted_tenants():
            if tenant and name != tenant:
                continue
            with state.lock:
                for tok, scope in sorted(state.scopes.items()):
                    trie, refs = scope.trie, scope.refs
                    nbytes = trie.nbytes() + refs.nbytes()
                    out.append(ScopeStats(name, tok, trie.node_count, nbytes, trie.outputs_inserted, len(refs)))
        return out

    def tenants(self) -> list[str]:
        return [name for name, _ in self._sorted_tenants()]

    def _sorted_tenants(self) -> list[tuple[str, _Tenant]]:
        with self._lock:
            return sorted(self._tenants.items())

    # ---- snapshot ----------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """EventApplier: every scope's trie and whole outputs plus the applied event ids."""
        state = codec.StoreState()
        for name, tenant in self._sorted_tenants():
            with tenant.lock:
                state.applied[name] = list(tenant.applied)
                for tok, scope in sorted(tenant.scopes.items()):
                    state.scopes.append(codec.ScopeState(name, tok, scope.trie.dump_outputs(), scope.refs.items()))
        return codec.encode(state)

    def restore(self, data: bytes) -> None:
        """EventApplier: replace the whole state with a snapshot's (raises SnapshotError, state kept).

        Writes racing with a restore may be lost: restore at start, or from the consumer's own thread.
        """
        state = codec.decode(data)
        tenants = {name: _Tenant(applied=OrderedDict.fromkeys(ids)) for name, ids in state.applied.items()}
        for saved in state.scopes:
            scope = _Scope(self._load_trie(saved.trie), self._new_refs())
            for ids, count in saved.outputs:
                scope.refs.add(ids, count)
            tenants.setdefault(saved.tenant, _Tenant()).scopes[saved.tokenizer_id] = scope
        with self._lock:
            self._tenants = tenants
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
        log.info("draft cache restored %d tenants from %s", len(self._tenants), path)
        return True
