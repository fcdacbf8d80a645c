"""RetrieverCore: the retriever as a library (the gRPC servicer is a thin layer over it).

    core = RetrieverCore(RetrieverSettings(data_dir=None))          # loads embedder + tokenizer
    core.ingest("acme", [Document("json.dumps", "json.dumps(obj)", "Serialize ...")])
    core.delete("acme", ["json.dumps"])
    result = core.retrieve("acme", "How do I write JSON?", k=4, m=2, max_new_tokens=128)
    result.prompt, result.prompt_ids, result.chunks, result.sessions
    core.retrieve("acme", "and with sorted keys?", history=[...])   # a conversation's last user turn
    core.sessions.apply(event)    # the event applier (GenerationCompleted -> past session)
    core.documents                # every tenant's index (tenants.TenantIndexes; DocumentChanged applies there)
    core.close()                  # persists the past sessions and the indexes not written yet

Every method is blocking (embedding, FAISS) and thread-safe; async callers use asyncio.to_thread.
Bad input raises services.common.errors.InvalidArgument with a one-line message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from lookahead_core.models import load_tokenizer, resolve_model_path
from lookahead_core.vocab import tokenizer_id
from transformers import AutoConfig

from lookahead_rag.services.common.errors import FailedPrecondition, InvalidArgument
from lookahead_rag.services.common.model_settings import ModelSettings
from lookahead_rag.services.common.rules.context import context_room
from lookahead_rag.services.common.rules.conversation import Message, check_history, retrieval_query
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.retriever.adaptive_k import passages_to_keep
from lookahead_rag.services.retriever.chunking import chunk_spans
from lookahead_rag.services.retriever.doc_events import delete_change, upsert_change
from lookahead_rag.services.retriever.documents import Document, ScoredChunk
from lookahead_rag.services.retriever.embeddings import Embedder, Encoder
from lookahead_rag.services.retriever.encode_gate import GatedEncoder
from lookahead_rag.services.retriever.hybrid import HybridConfig, hybrid_search
from lookahead_rag.services.retriever.index import TenantIndex
from lookahead_rag.services.retriever.lexical import LexicalIndexes
from lookahead_rag.services.retriever.prompt import Passage, PastAnswer, PromptTooLong, build_prompt
from lookahead_rag.services.retriever.sessions import PastSessions, ScoredSession
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.services.retriever.store import IndexStore
from lookahead_rag.services.retriever.tenants import TenantIndexes
from lookahead_rag.services.retriever.vector_cache import with_cache

log = logging.getLogger(__name__)

MS_PER_S = 1000.0
# tokenizer.model_max_length is a huge sentinel when the tokenizer does not know its model's window.
UNKNOWN_MODEL_MAX_LENGTH = 10**9


@dataclass(frozen=True, slots=True)
class IngestResult:
    documents: int  # documents accepted (new or changed)
    unchanged: int  # documents already ingested with the same content (skipped)
    chunks: int  # chunks added
    total_chunks: int  # tenant's index size afterwards


@dataclass(frozen=True, slots=True)
class DeleteResult:
    documents: int  # documents removed (ids this replica did not hold are skipped)
    total_chunks: int  # tenant's index size afterwards


@dataclass(frozen=True, slots=True)
class RetrieveResult:
    chunks: list[ScoredChunk]  # in the prompt's order ([n] is the nth; settings.passage_order); one may be cut
    sessions: list[ScoredSession]  # in the prompt, best first (the lowest-scored item kept may be cut)
    prompt: str
    prompt_ids: list[int]
    tokenizer_id: str
    retrieve_ms: float  # embedding + search
    budget: int = 0  # prompt token budget used (not on the wire: 0 in a reply read from it)
    notes: list[str] = field(default_factory=list)  # for people: unknown tenant, items dropped for the budget
    unknown_tenant: bool = False  # no documents were ever ingested for this tenant
    history_turns_kept: int = 0  # the conversation's newest turns in the prompt (the oldest are cut first)


@dataclass(frozen=True, slots=True)
class RetrieverStats:
    chunks: int
    sessions: int
    tenants: list[str]
    model: str = ""  # the served model the retriever builds prompts for
    tokenizer_id: str = ""  # that model's token space


def context_window(tokenizer: Any, model_path: str) -> int:
    """The model's context length: tokenizer.model_max_length if real, else the config's max positions."""
    limit = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if 0 < limit < UNKNOWN_MODEL_MAX_LENGTH:
        return limit

    config = AutoConfig.from_pretrained(model_path)
    return int(config.max_position_embeddings)


class RetrieverCore:
    """Per-tenant indexes + past sessions + prompt assembly."""

    def __init__(
        self,
        settings: RetrieverSettings | None = None,
        *,
        embedder: Encoder | None = None,
        tokenizer: Any | None = None,
        limits: RequestLimits | None = None,
        served: ModelSettings | None = None,
    ) -> None:
        self.settings = s = settings if settings is not None else RetrieverSettings()
        self.served = served if served is not None else ModelSettings()  # whose tokenizer builds prompts
        self.limits = limits if limits is not None else RequestLimits()
        if s.torch_threads:
            # Process-wide: one-query embeddings gain nothing from a second thread and lose a lot when
            # the other core is busy (fork/join waits). Leave it 0 when a generator shares the process.
            torch.set_num_threads(s.torch_threads)
        encoder: Encoder = (
            embedder
            if embedder is not None
            else Embedder(s.embedder_path, batch_size=s.embed_batch_size, progress_min_texts=s.progress_min_texts)
        )
        self.embedder: Encoder = with_cache(encoder, s.vector_cache, getattr(encoder, "name", ""))
        # every embedding this core asks for takes turns here: ingest in slices, queries first (encode_gate.py)
        self.encoder: Encoder = GatedEncoder(self.embedder, s.ingest_encode_slice, busy_share=s.ingest_busy_share,
                                             busy_window_s=s.ingest_busy_window_s)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.served.name)
        self.tokenizer_id: str = tokenizer_id(self.tokenizer)
        model_ctx = context_window(self.tokenizer, resolve_model_path(self.served.name))
        self.context_tokens: int = min(model_ctx, s.max_context_tokens)
        self._store = IndexStore(s.data_dir)
        self.documents = TenantIndexes(s, self.encoder, self._store)  # documents change only through it
        self._indexes: dict[str, TenantIndex] = self.documents.indexes  # the same dict (searches read it)
        self.sessions = PastSessions(self.encoder, s.max_sessions_per_tenant, s.max_remembered_event_ids,
                                     s.tenant_remembered_event_ids)
        saved = self._store.load_sessions()
        if saved is not None:
            self.sessions.restore(saved)
        self._lock = self.documents.lock  # guards _indexes and every TenantIndex in it (and _lexical)
        self._lexical = LexicalIndexes(s.bm25_k1, s.bm25_b)  # each tenant's BM25, rebuilt after a change
        self._hybrid = HybridConfig(s.hybrid_depth, s.rrf_k)
    # ---- validation -------------------------------------------------------------------------------

    def _check_documents(self, documents: Sequence[Document]) -> None:
        s = self.settings
        seen: set[str] = set()
        for n, doc in enumerate(documents):
            where = f"document {n} ({doc.id[:40]!r})" if doc.id else f"document {n}"
            if not doc.id.strip():
                raise InvalidArgument(f"{where}: empty id")
            if len(doc.id) > s.max_doc_id_chars:
                raise InvalidArgument(f"{where}: id is {len(doc.id)} characters; the limit is {s.max_doc_id_chars}")
            if not doc.text.strip():
                raise InvalidArgument(f"{where}: empty text")
            if len(doc.text) > s.max_doc_chars:
                raise InvalidArgument(f"{where}: text is {len(doc.text)} characters; the limit is {s.max_doc_chars}")
            self.limits.check_document_fields(where, doc.title, doc.source)
            if doc.id in seen:
                raise InvalidArgument(f"{where}: id appears twice in one request")
            seen.add(doc.id)
        chunks = sum(len(chunk_spans(doc.text, s.chunk_chars, s.chunk_overlap)) for doc in documents)
        if chunks > s.max_chunks_per_request:
            raise InvalidArgument(f"documents: {len(documents)} documents make {chunks} chunks; the limit is "
                                  f"{s.max_chunks_per_request} per request (send them in smaller requests)")

    def check_ingest(self, tenant: str, documents: Sequence[Document]) -> None:
        """Refuse what ``ingest`` would refuse (InvalidArgument), changing nothing."""
        self.limits.check_tenant(tenant)
        if not documents:
            raise InvalidArgument("no documents to ingest")
        self._check_documents(documents)

    def check_delete(self, tenant: str, doc_ids: Sequence[str]) -> list[str]:
        """The ids to delete, each once; InvalidArgument for what ``delete`` would refuse."""
        self.limits.check_tenant(tenant)
        if not doc_ids:
            raise InvalidArgument("no document ids to delete")
        limit = self.settings.max_doc_id_chars
        for n, doc_id in enumerate(doc_ids):
            if not doc_id.strip():
                raise InvalidArgument(f"document id {n}: empty")
            if len(doc_id) > limit:
                raise InvalidArgument(f"document id {n}: {len(doc_id)} characters; the limit is {limit}")
        return list(dict.fromkeys(doc_ids))

    # ---- ingest / delete (this replica only: services.retriever.doc_writer also tells the others) ---
    def ingest(self, tenant: str, documents: Sequence[Document]) -> IngestResult:
        """Chunk, embed and index documents; unchanged ones are skipped, changed ones replaced. Persists."""
        self.check_ingest(tenant, documents)
        done = self.documents.apply(tenant, [upsert_change(doc) for doc in documents], persist=True)
        log.info("tenant %r: %d documents ingested (%d unchanged), %d chunks added, %d in total",
                 tenant, done.upserted, done.unchanged, done.chunks, done.total_chunks)  # fmt: skip
        return IngestResult(done.upserted, done.unchanged, done.chunks, done.total_chunks)

    def delete(self, tenant: str, doc_ids: Sequence[str]) -> DeleteResult:
        """Remove documents (their chunks) from the tenant's index; unknown ids are skipped. Persists."""
        ids = self.check_delete(tenant, doc_ids)
        done = self.documents.apply(tenant, [delete_change(doc_id) for doc_id in ids], persist=True)
        log.info("tenant %r: %d documents deleted (%d not held), %d chunks in total",
                 tenant, done.deleted, done.unchanged, done.total_chunks)  # fmt: skip
        return DeleteResult(done.deleted, done.total_chunks)

    # ---- retrieve ---------------------------------------------------------------------------------
    def search(self, tenant: str, question: str, k: int) -> list[ScoredChunk]:
        """Top-k chunks of the tenant for the question (embedding + FAISS, and BM25 with [retriever] hybrid)."""
        return self._search(tenant, question, self.encoder.encode_one(question), k)

    def _search(self, tenant: str, text: str, query: Any, k: int) -> list[ScoredChunk]:
        """The one search: FAISS best first, or with ``hybrid`` FAISS and BM25 fused (hybrid.py).

        A stale BM25 index is rebuilt outside the lock every tenant's search takes (``LexicalIndexes.prepare``);
        when the tenant's documents changed again during that build, this one search is FAISS alone."""
        with self._lock:
            index = self._indexes.get(tenant)
        if index is None:
            return []
        hybrid = self.settings.hybrid and self._lexical.prepare(index, self._lock)
        with self._lock:
            if hybrid and self._lexical.ready(index):  # ready: hybrid_search builds nothing under the lock
                return hybrid_search(index, self._lexical, text, query, k, self._hybrid)
            return index.search(query, k)

    def prompt_budget(self, max_new_tokens: int) -> int:
        """Prompt tokens available once ``max_new_tokens`` are reserved in the context window."""
        room = context_room(self.context_tokens, max_new_tokens)
        return 0 if room is None else room  # None only for an unknown window, which the retriever never has

    def retrieve(self, tenant: str, question: str, k: int = 0, m: int = 0, max_new_tokens: int = 0,
                 tokenizer_id: str = "", history: Sequence[Message] = ()) -> RetrieveResult:
        """Top-k chunks, top-m past sessions and the grounded prompt within the token budget.

        Past sessions enter the prompt only with ``[retriever] past_answers_in_prompt`` (off by default:
        measured to steer answers, bench/README.md "Answer quality"), and then only answers their passages
        supported; the drafts get every past answer from the draft cache either way.

        ``tokenizer_id`` is the caller's token space: a prompt in another one would be garbage to
        it, so a mismatch is refused (FailedPrecondition) rather than answered; empty skips the check.
        ``history``: the conversation before ``question`` (its last user turn), in the prompt as its
        newest turns that fit; a follow-up question is searched with the user turn before it
        (``services.common.rules.conversation.retrieval_query``, ``[retriever] followup_max_words``).
        """
        s, limits = self.settings, self.limits
        self.check_tokenizer(tokenizer_id)
        limits.check_tenant(tenant)
        limits.check_question(question)
        check_history(history, limits)
        k, m = limits.resolve_k(k), limits.resolve_m(m)
        max_new = limits.resolve_max_new_tokens(max_new_tokens)
        notes: list[str] = []
        with self._lock:
            unknown_tenant = tenant not in self._indexes
        if unknown_tenant:
            notes.append(f"tenant {tenant!r} has no documents")
        start = time.perf_counter()
        text = retrieval_query(question, history, s.followup_max_words)
        query = self.encoder.encode_one(text)  # [1, dim]
        found = self._search(tenant, text, query, k)
        found = found[: passages_to_keep([c.score for c in found], s.passage_min_score_ratio, s.min_passages)]
        past = self.sessions.search(tenant, query, m, supported_only=True) if s.past_answers_in_prompt else []
        retrieve_ms = (time.perf_counter() - start) * MS_PER_S
        budget = self.prompt_budget(max_new)
        try:
            built = build_prompt(
                self.tokenizer,
                question,
                [Passage(c.chunk.title, c.chunk.text, c.score, c.chunk.doc_id, c.chunk.number()) for c in found],
                [PastAnswer(p.session.question, p.session.answer, p.score) for p in past],
                budget,
                s.system_prompt,
                s.min_truncated_tokens,
                s.passage_order,
                history,
            )
        except PromptTooLong as exc:
            raise PromptTooLong(
                f"{exc} (context {self.context_tokens} - max_new_tokens {max_new}); shorten the question"
            ) from exc
        chunks = [_cut_chunk(found[i], chars) for i, chars in built.passages]
        sessions = [_cut_session(past[i], chars) for i, chars in built.answers]
        dropped = len(found) + len(past) - len(chunks) - len(sessions)
        if dropped:
            notes.append(f"{dropped} retrieved item(s) left out to fit {budget} prompt tokens")
        if built.truncated:
            notes.append("the lowest-scored item in the prompt was cut to fit")
        turns_cut = built.turns_total - built.history_turns_kept
        if turns_cut:
            notes.append(f"the {turns_cut} oldest conversation turn(s) left out to fit {budget} prompt tokens")
        return RetrieveResult(chunks, sessions, built.text, built.ids, self.tokenizer_id, retrieve_ms, budget, notes,
                              unknown_tenant, built.history_turns_kept)

    def check_tokenizer(self, caller: str) -> None:
        """Refuse a caller whose served model tokenizes differently (FailedPrecondition)."""
        if caller and caller != self.tokenizer_id:
            raise FailedPrecondition(
                f"the retriever builds prompts for model {self.served.name!r} (tokenizer {self.tokenizer_id}), "
                f"the caller's tokenizer is {caller}: set the same [model] name for both services"
            )

    # ---- stats / lifecycle ------------------------------------------------------------------------
    def stats(self, tenant: str = "") -> RetrieverStats:
        """Counts for one tenant (``tenants``: it alone, when known: never the others' names), or totals
        over all tenants when ``tenant`` is empty (callers of every tenant only, under [auth])."""
        with self._lock:
            tenants = sorted(set(self._indexes) | set(self.sessions.tenants()))
            if tenant:
                index = self._indexes.get(tenant)
                return RetrieverStats(len(index) if index else 0, self.sessions.count(tenant),
                                      [t for t in tenants if t == tenant], self.served.name, self.tokenizer_id)
            return RetrieverStats(sum(len(i) for i in self._indexes.values()), self.sessions.count(), tenants,
                                  self.served.name, self.tokenizer_id)

    def save_sessions(self) -> None:
        """Persist the past sessions (atomic); a no-op without data_dir."""
        if self.settings.data_dir is not None:
            self._store.save_sessions(self.sessions.snapshot())

    def close(self) -> None:
        self.save_sessions()
        self.documents.save_changed()


def _cut_chunk(found: ScoredChunk, chars: int) -> ScoredChunk:
    chunk = found.chunk
    if chars >= len(chunk.text):
        return found
    return ScoredChunk(replace(chunk, text=chunk.text[:chars], end=chunk.start + chars), found.score)


def _cut_session(found: ScoredSession, chars: int) -> ScoredSession:
    record = found.session
    if chars >= len(record.answer):
        return found
    return ScoredSession(replace(record, answer=record.answer[:chars]), found.score)
