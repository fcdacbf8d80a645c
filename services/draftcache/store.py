"""DraftCacheStore: per (tenant, tokenizer) tries of past outputs plus whole recent outputs. No gRPC.

    store = DraftCacheStore(settings)
    store.load_snapshot(path)                                   # if one was saved
    store.add_output("acme", tok_id, output_ids, event_id)     # True once per event id
    continuations = store.fetch("acme", tok_id, prompt_ids, reference_ids, budget=0)  # [Continuation(ids, weight)]

Also the bus's EventApplier for ``GenerationCompleted`` and ``ForgetRequested`` (``apply`` /
``snapshot`` / ``restore``).
Tenants and tokenizers never mix: each (tenant, tokenizer_id) has its own trie and outputs, and a
fetch reads only its own scope. Applied event ids are remembered per tenant (bounded) and kept in
the snapshot, so replaying the log after a restore applies nothing twice.

At most ``max_tenants`` tenants are held. The output of a new tenant past that evicts the least
recently used tenant (by ``fetch`` or ``add_output``): its tries, whole outputs and applied event
ids go, eviction listeners hear its name (the meter counts it), a log line names it, and the new
tenant's output is applied. An evicted tenant starts afresh: a later fetch finds nothing, its next
output is kept. Snapshots list tenants least recently used first, so a restore keeps that order
(and evicts down to ``max_tenants`` when the snapshot holds more); an evicted tenant is in no
snapshot taken after its eviction.

Thread-safety: each tenant has one lock, held by its writes, fetches, stats and its part of a
snapshot, so one tenant never waits for another's work and a snapshot never stalls every writer
at once; a store-wide lock guards the tenant table (creating, evicting, the use order, swapping
state on ``restore``). Each tenant's part of a snapshot is consistent with its applied event ids
(events are per tenant). A write racing with its tenant's eviction lands in the evicted copy, as if
the eviction had come just after it.

Forgetting (``forget``, a ``ForgetRequested`` event): every scope also logs its recent outputs with
the documents they were grounded on (``lookahead_rag.services.draftcache.forget``). A forget of a whole tenant drops
its scopes; a forget of one document drops the logged outputs grounded on it and rebuilds each scope's
trie and whole outputs from what its log still holds. Both keep the tenant's applied event ids (a
resent answer is not applied again) and record the forget in the store's ``ForgetLedger``, which
outlives evictions and rides in the snapshot: an answer that began before the forget is never kept.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lookahead_core.drafting.trie import TokenTrie
from lookahead_core.vocab import vocab_size_of

from lookahead_rag.services.common.errors import InvalidArgument, ResourceExhausted
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache import codec
from lookahead_rag.services.draftcache.fetch import Continuation, fetch_continuations
from lookahead_rag.services.draftcache.forget import OutputLog, needs_rebuild, rebuild
from lookahead_rag.services.draftcache.persistence import read_file, write_file_atomic
from lookahead_rag.services.draftcache.references import ReferenceStore
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.validate import check_budget, check_ids, check_name
from lookahead_rag.services.events.forget import EVERYTHING, ForgetLedger
from lookahead_rag.v1 import events_pb2

log = logging.getLogger(__name__)

_TRIE_BRANCH_LENGTH = struct.Struct("<q")  # first field of TokenTrie.dump_outputs()

EvictionListener = Callable[[str], None]  # called with each evicted tenant, outside the store's locks


@dataclass(frozen=True, slots=True)
class ScopeStats:
    tenant: str
    tokenizer_id: str
    nodes: int  # trie nodes
    bytes: int  # approximate memory: trie nodes + outputs kept whole + their index + the forget log
    outputs: int  # outputs inserted into the trie (pruning does not lower it)
    references: int  # distinct outputs kept whole


@dataclass
class _Scope:
    """One (tenant, tokenizer): the trie of output windows, the outputs kept whole, the forget log."""

    trie: TokenTrie
    refs: ReferenceStore
    log: OutputLog  # the recent outputs and their documents: what a forget rebuilds the scope from


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
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the tenant table and its use order, the counters
        self._eviction_listeners: list[EvictionListener] = []
        self.changes = 0  # bumped by every applied change (persistence saves when it moved)
        self.saved_changes = 0  # ``changes`` at the last save/load (an empty new store needs no file)
        self.evictions = 0  # tenants evicted (least recently used) to stay within max_tenants
        self._ledger = ForgetLedger()  # forgets applied and their horizons (store lock; survives evictions)

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Call ``listener(tenant)`` after each eviction (outside the store's locks)."""
        self._eviction_listeners.append(listener)

    # ---- tenants and scopes --------------------------------------------------------------------
    def _new_refs(self) -> ReferenceStore:
        s = self.settings
        return ReferenceStore(s.max_references, s.similarity_ngram, s.max_reference_tokens, s.max_ngram_outputs)

    def _new_log(self) -> OutputLog:
        """A scope's forget log: as many outputs, as long, as the whole outputs it keeps."""
        return OutputLog(self.settings.max_references, self.settings.max_reference_tokens)

    def _tenant_for_write(self, name: str) -> _Tenant:
        """The tenant, now the most recently used; a new one evicts the least recently used past max_tenants."""
        with self._lock:
            tenant = self._tenants.get(name)
            if tenant is not None:
                self._tenants.move_to_end(name)
                return tenant
            evicted = self._evict_down_to(self.settings.max_tenants - 1)
            tenant = self._tenants[name] = _Tenant()
        self._report_evictions(evicted)
        return tenant

    def _tenant_for_read(self, name: str) -> _Tenant | None:
        """The tenant, now the most recently used, or None when the store does not hold it."""
        with self._lock:
            tenant = self._tenants.get(name)
            if tenant is not None:
                self._tenants.move_to_end(name)
            return tenant

    def _evict_down_to(self, keep: int) -> list[str]:
        """Drop least recently used tenants until ``keep`` remain (store lock held); their names."""
        evicted = []
        while len(self._tenants) > keep:
            name, _ = self._tenants.popitem(last=False)
            evicted.append(name)
        if evicted:
            self.evictions += len(evicted)
            self.changes += 1  # the next snapshot must not hold them
        return evicted

    def _report_evictions(self, names: Sequence[str]) -> None:
        """Log each evicted tenant and tell the listeners (no store lock held: they may call back)."""
        for name in names:
            log.info("draft cache evicted tenant %r, the least recently used (max_tenants=%d)",
                     name, self.settings.max_tenants)
            for listener in self._eviction_listeners:
                listener(name)

    def _scope_for_write(self, tenant: _Tenant, name: str, tokenizer_id: str) -> _Scope:
        """The tenant's scope of ``tokenizer_id``, created if the limit allows (tenant lock held)."""
        scope = tenant.scopes.get(tokenizer_id)
        if scope is not None:
            return scope
        if len(tenant.scopes) >= self.settings.max_tokenizers_per_tenant:
            raise ResourceExhausted(
                f"tenant {name!r} has {len(tenant.scopes)} tokenizers already (max_tokenizers_per_tenant)"
            )
        scope = tenant.scopes[tokenizer_id] = _Scope(TokenTrie(self._trie_config), self._new_refs(), self._new_log())
        return scope

    def _changed(self) -> None:
        with self._lock:
            self.changes += 1

    # ---- writes ------------------------------------------------------------------------------
    def add_output(self, tenant: str, tokenizer_id: str, output_ids: Sequence[int], event_id: str,
                   doc_ids: Sequence[str] = ()) -> bool:
        """Insert one finished output, grounded on ``doc_ids``; False (nothing changed) when ``event_id``
        was applied before."""
        s = self.settings
        self.limits.check_tenant(tenant)
        check_name("tokenizer_id", tokenizer_id, s.max_name_chars)
        check_name("event_id", event_id, s.max_name_chars)
        ids = check_ids("output_ids", output_ids, s.max_request_ids, vocab_size_of(tokenizer_id))
        state = self._tenant_for_write(tenant)
        with state.lock:
            if event_id in state.applied:
                return False
            scope = self._scope_for_write(state, tenant, tokenizer_id)
            scope.trie.insert_output(ids)
            scope.refs.add(ids)
            scope.log.add(ids, doc_ids)
            self._remember(state, event_id)
        self._changed()
        return True

    def _remember(self, state: _Tenant, event_id: str) -> None:
        """Note an applied event id (tenant lock held), forgetting the oldest past max_event_ids."""
        state.applied[event_id] = None
        while len(state.applied) > self.settings.max_event_ids:
            state.applied.popitem(last=False)

    def apply(self, event: events_pb2.GenerationCompleted | events_pb2.ForgetRequested) -> bool:
        """EventApplier: insert a GenerationCompleted's output, or apply a ForgetRequested; False when
        its event_id was applied before. An answer that began before a forget covering it is not kept."""
        if isinstance(event, events_pb2.ForgetRequested):
            return self.forget(event)
        with self._lock:
            covered = self._ledger.covers(event)
        if covered:  # handled: a resend meets the same horizon again
            log.info("draft cache: output %s of tenant %r began before a forget; not kept", event.event_id,
                     event.tenant)
            return True
        return self.add_output(event.tenant, event.tokenizer_id, event.output_ids, event.event_id,
                               list(event.doc_ids))

    def forget(self, event: events_pb2.ForgetRequested) -> bool:
        """Drop the tenant's outputs (all of them, or those grounded on ``event.doc_id``) and rebuild
        its tries without them; False (nothing changed) when this forget was applied before."""
        with self._lock:
            if not self._ledger.admit(event):
                return False
            self.changes += 1  # the ledger is in the snapshot
            state = self._tenants.get(event.tenant)  # not a use: no LRU move
        if state is None:
            return True
        with state.lock:
            self._remember(state, event.event_id)
            if event.doc_id == EVERYTHING:
                state.scopes.clear()
            else:
                for tok, scope in list(state.scopes.items()):
                    self._forget_doc(state, tok, scope, event.doc_id)
        log.info("draft cache forgot tenant %r's outputs (%s)", event.tenant,
                 f"document {event.doc_id!r}" if event.doc_id else "all")
        self._changed()
        return True

    def _forget_doc(self, state: _Tenant, tokenizer_id: str, scope: _Scope, doc_id: str) -> None:
        """Rebuild one scope without the outputs grounded on ``doc_id`` (tenant lock held); an empty one goes."""
        if not needs_rebuild(scope.log.drop(doc_id), scope.log):
            return
        if not scope.log:
            del state.scopes[tokenizer_id]
            return
        scope.trie, scope.refs = rebuild(scope.log, self._trie_config, self._new_refs,
                                         self.settings.max_rebuild_tokens)

    # ---- reads -------------------------------------------------------------------------------
    def fetch(
        self,
        tenant: str,
        tokenizer_id: str,
        prompt_ids: Sequence[int],
        reference_ids: Sequence[int] = (),
        budget: int = 0,
    ) -> list[Continuation]:
        """The request-scoped continuations of this tenant's past outputs (see services.draftcache.fetch).

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
        state = self._tenant_for_read(tenant)
        if state is None:
            return []
        with state.lock:
            scope = state.scopes.get(tokenizer_id)
            if scope is None:
                return []
            return fetch_continuations(scope.trie, scope.refs, prompt, references, budget, s)

    def stats(self, tenant: str = "") -> list[ScopeStats]:
        """Per-scope sizes of ``tenant`` (every tenant when empty), sorted by (tenant, tokenizer)."""
        out = []
        for name, state in self._sorted_tenants():
            if tenant and name != tenant:
                continue
            with state.lock:
                for tok, scope in sorted(state.scopes.items()):
                    trie, refs = scope.trie, scope.refs
                    nbytes = trie.nbytes() + refs.nbytes() + scope.log.nbytes()
                    out.append(ScopeStats(name, tok, trie.node_count, nbytes, trie.outputs_inserted, len(refs)))
        return out

    def tenants(self) -> list[str]:
        return [name for name, _ in self._sorted_tenants()]

    def _sorted_tenants(self) -> list[tuple[str, _Tenant]]:
        with self._lock:
            return sorted(self._tenants.items())

    def _tenants_by_use(self) -> list[tuple[str, _Tenant]]:
        """(name, tenant), least recently used first."""
        with self._lock:
            return list(self._tenants.items())

    # ---- snapshot ----------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """EventApplier: every scope's trie and whole outputs plus the applied event ids, tenants
        least recently used first (the order a restore takes back)."""
        with self._lock:
            state = codec.StoreState(ledger=self._ledger.to_bytes())
        for name, tenant in self._tenants_by_use():
            with tenant.lock:
                state.applied[name] = list(tenant.applied)
                for tok, scope in sorted(tenant.scopes.items()):
                    state.scopes.append(codec.ScopeState(name, tok, scope.trie.dump_outputs(), scope.refs.items(),
                                                         scope.log.items(), scope.log.complete))
        return codec.encode(state)

    def restore(self, data: bytes) -> None:
        """EventApplier: replace the whole state with a snapshot's (raises SnapshotError, state kept).

        Writes racing with a restore may be lost: restore at start, or from the consumer's own thread.
        """
        state = codec.decode(data)
        try:
            ledger = ForgetLedger.from_bytes(state.ledger)
        except ValueError as exc:
            raise codec.SnapshotError(str(exc)) from exc
        tenants = OrderedDict((name, _Tenant(applied=OrderedDict.fromkeys(ids))) for name, ids in state.applied.items())
        for saved in state.scopes:
            scope = _Scope(self._load_trie(saved.trie), self._new_refs(), self._new_log())
            for ids, count in saved.outputs:
                scope.refs.add(ids, count)
            for ids, doc_ids in saved.log:
                scope.log.add(ids, doc_ids)
            scope.log.complete = saved.complete and scope.log.complete  # a smaller capacity now: not complete
            tenants.setdefault(saved.tenant, _Tenant()).scopes[saved.tokenizer_id] = scope
        with self._lock:
            self._tenants = tenants
            self._ledger = ledger
            self.changes += 1
            evicted = self._evict_down_to(self.settings.max_tenants)  # max_tenants may be lower than when saved
        self._report_evictions(evicted)

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
