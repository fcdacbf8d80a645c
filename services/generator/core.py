"""GeneratorCore: retrieve -> fetch drafts -> lookahead decoding -> stream -> publish. No gRPC here.

One request: the retriever gives the grounded prompt (if it is down or late, the question and its
conversation are templated alone and the stats say documents were unavailable); the draft cache
gives the tenant's continuations once (how its past outputs went on; if down or late, the request
drafts from its own prompt only); decoding runs on the engine's step scheduler
(lookahead_core.engine.scheduler: one thread owns the model and verifies every in-flight request in
one batched forward per step; a bounded queue with fair share by tenant holds the rest) and each
verified step is streamed; the finished answer is published as a ``GenerationCompleted`` event. A
dependency failing never fails the request, and drafts never change the answer (decoding is
lossless: greedy, or sampled with draws keyed by the request's seed, so a sampled answer is plain
sampling with that seed; the final stats carry the seed used).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from lookahead_core import (
    DEFAULT_MODEL,
    DecodingConfig,
    TextStreamer,
    TokenTrie,
    check_in_vocab,
    out_of_vocab,
    tokenizer_id,
)
from lookahead_core.serving import (
    KVTooLong,
    QueueFull,
    RequestExpired,
    SchedulerClosed,
    ServeRequest,
    ServeStats,
    StepScheduler,
    shared_kernels,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lookahead_rag.services.common.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from lookahead_rag.services.common.rules.context import check_fits, context_room
from lookahead_rag.services.common.rules.conversation import check_history
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.rules.quota import TenantQuotas
from lookahead_rag.services.common.telemetry.logs import log_text
from lookahead_rag.services.common.telemetry.tracing import request_spans
from lookahead_rag.services.events import EventPublisher
from lookahead_rag.services.generator.attribution import DraftAttribution
from lookahead_rag.services.generator.bridge import Bridge, Ended
from lookahead_rag.services.generator.clients import DraftCacheClient, RetrieverClient
from lookahead_rag.services.generator.convert import completed_event
from lookahead_rag.services.generator.domain import (
    AnswerChunk,
    AnswerQuery,
    ChatMessage,
    FinalInfo,
    GenerateQuery,
    GenerationParams,
    GenerationStats,
    TextDelta,
)
from lookahead_rag.services.generator.engine_config import scheduler_config
from lookahead_rag.services.generator.grounding import clamped, fallback, fill_room, retrieve
from lookahead_rag.services.generator.logprobs import check_logprobs
from lookahead_rag.services.generator.metrics import EngineMetrics
from lookahead_rag.services.generator.params import check_mode, decoding_config, server_config
from lookahead_rag.services.generator.prepared import Prepared, PromptFacts
from lookahead_rag.services.generator.read_ahead import read_ahead
from lookahead_rag.services.generator.render import PromptRenderer
from lookahead_rag.services.generator.safe_stream import (
    Chunker,
    SafeStreamConfig,
    max_token_bytes,
    safe_stream,
    text_budget,
)
from lookahead_rag.services.generator.settings import GeneratorSettings
from lookahead_rag.services.generator.verdict import AnswerCheck

log = logging.getLogger(__name__)
DEADLINE_MARGIN_S = 0.05  # leave this much of the caller's deadline for our own reply
MS = 1000.0


def fill_trie(req: ServeRequest, continuations: list[tuple[list[int], int]]) -> None:
    """The request's trie: the tenant's past outputs (every window, as output counts), then its prompt
    and references (``ServeRequest.fill_trie``)."""
    for ids, count in continuations:
        req.trie.insert_output(ids, count=count, prune=False)
    req.fill_trie()


class GeneratorCore:
    """The generator as a library: thin gRPC servicers and the demo both drive it."""

    def __init__(
        self,
        settings: GeneratorSettings,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        retriever: RetrieverClient | None = None,
        draft_cache: DraftCacheClient | None = None,
        publisher: EventPublisher | None = None,
        metrics: EngineMetrics | None = None,
        limits: RequestLimits | None = None,
        model_name: str = DEFAULT_MODEL,
        draft_model: PreTrainedModel | None = None,
    ) -> None:
        self.settings = settings
        self.model_name = model_name  # the served model's name ([model] name), stamped on every event
        self.limits = limits if limits is not None else RequestLimits()
        self.quotas = TenantQuotas.of(self.limits)  # per-tenant rate and open streams (services/common/rules/quota.py)
        self.tokenizer = tokenizer
        self.config = server_config(settings, self.limits)
        on_forward = None if metrics is None else metrics.record_forward
        sched = scheduler_config(settings)
        self.scheduler = StepScheduler(  # twins cut for the engine thread's threads, not this (one-thread) one's
            model, tokenizer, sched, kernels=shared_kernels(model, threads=sched.threads), on_forward=on_forward,
            draft_model=draft_model,
        ).start()
        self.tokenizer_id = tokenizer_id(tokenizer)
        self.token_bytes = max_token_bytes(tokenizer)  # the longest token's UTF-8 bytes: sizes safe-stream chunks
        self.vocab_size = max(len(tokenizer), int(model.config.vocab_size))  # bound of reference ids
        self.tokenizer_size = len(tokenizer)  # bound of prompt ids: tokens the tokenizer can decode
        self.context_tokens = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.render = PromptRenderer(tokenizer, self.tokenizer_size, self.limits, self.context_tokens)  # off the loop
        self.check = AnswerCheck(settings.ungrounded, settings.refusal)  # citations and grounded, off the loop
        self.retriever = retriever
        self.draft_cache = draft_cache
        self.publisher = publisher
        self.metrics = metrics

    @property
    def inflight(self) -> int:
        """Requests waiting or running in the scheduler."""
        state = self.scheduler.state()
        return state.waiting + state.running

    def observe_metrics(self) -> None:
        """Sample the scheduler's queue, running requests and KV bytes into the metrics (Refresher job)."""
        if self.metrics is not None:
            state = self.scheduler.state()
            self.metrics.observe_engine(state.waiting, state.running, state.kv_bytes)

    def close(self) -> None:
        self.scheduler.close()
        self.check.close()

    # ---- validation -------------------------------------------------------------------------------
    def decoding_config(self, params: GenerationParams) -> DecodingConfig:
        """The request's decoding config from its params (0 / empty = server default; temperature 0 = greedy)."""
        return decoding_config(params, self.config, self.settings, self.limits)

    def _check_fits(self, prompt_ids: Sequence[int], config: DecodingConfig) -> None:
        if not prompt_ids:
            raise InvalidArgument("the prompt is empty")
        check_fits(len(prompt_ids), config.max_new_tokens, self.context_tokens)

    # ---- entry points -----------------------------------------------------------------------------
    async def answer(self, query: AnswerQuery, deadline: float | None = None, request_id: str | None = None,
                     on_prompt: Callable[[PromptFacts], None] | None = None) -> AsyncIterator[AnswerChunk]:
        """Answer a tenant's question, grounded on retrieved documents; streams TextDeltas, then a FinalInfo.
        ``on_prompt`` hears what the prompt came to before the first token (never for a safe stream)."""
        told = None if self.is_safe(query.tenant, query.params) else on_prompt
        async for chunk in self._served(query.tenant, query.params, self._answer(query, deadline, request_id, told)):
            yield chunk

    async def generate(self, query: GenerateQuery, deadline: float | None = None,
                       request_id: str | None = None) -> AsyncIterator[AnswerChunk]:
        """Decode a caller-built prompt (raw text or chat messages) with optional references."""
        async for chunk in self._served(query.tenant, query.params, self._generate(query, deadline, request_id)):
            yield chunk

    async def _served(self, tenant: str, params: GenerationParams,
                      chunks: AsyncGenerator[AnswerChunk]) -> AsyncIterator[AnswerChunk]:
        """One request's stream within its tenant's quota, read ahead of its consumer (read_ahead.py: its
        stream slot is freed when the request ends, even while a send still waits on a client that stopped
        reading), re-cut by the safe stream when the request or its tenant asks for it."""
        self.limits.check_tenant(tenant)  # the request's one tenant check
        safe = self.is_safe(tenant, params)
        check_logprobs(params, safe)
        check_mode(params, tenant, self.settings)  # the operator's modes for the tenant ([generator] tenant_modes)
        with self.quotas.admit(tenant) as release:
            ahead = read_ahead(chunks, release)
            stream = self._safe(ahead, params) if safe else ahead
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()
                await ahead.aclose()
                await chunks.aclose()

    def is_safe(self, tenant: str, params: GenerationParams) -> bool:
        """Whether the stream is side-channel safe: asked for by the request, or always for the tenant."""
        return params.safe_stream or tenant in self.settings.safe_stream_tenants

    def _safe(self, chunks: AsyncIterator[AnswerChunk], params: GenerationParams) -> AsyncGenerator[AnswerChunk]:
        s = self.settings
        config = SafeStreamConfig(s.safe_stream_interval_ms / MS, s.safe_stream_chunk_tokens,
                                  text_budget(s.safe_stream_chunk_tokens, self.token_bytes))
        streamer = TextStreamer(self.tokenizer, params.stop)  # as _decode's (bad stops are refused there)
        return safe_stream(chunks, Chunker(streamer, config), config.interval_s)

    def _prepared(self, tenant: str, params: GenerationParams, up_to_context: bool, request_id: str | None,
                  question: str = "", history: tuple[ChatMessage, ...] = ()) -> Prepared:
        """An answer's or a generation's request before its prompt: its decoding config (the OpenAI endpoint's
        rule, ``up_to_context``: max_new_tokens clamped, 0 filled once the prompt is known)."""
        params = clamped(params, self.limits, up_to_context)
        return Prepared(tenant, question, [], [], self.decoding_config(params), request_id or uuid.uuid4().hex,
                        history=history, fill_context=up_to_context and not params.max_new_tokens)

    async def _answer(self, query: AnswerQuery, deadline: float | None = None, request_id: str | None = None,
                      on_prompt: Callable[[PromptFacts], None] | None = None) -> AsyncGenerator[AnswerChunk]:
        limits = self.limits
        question = limits.check_question(query.question)
        check_history(query.history, limits)
        k, m = limits.resolve_k(query.k), limits.resolve_m(query.m)
        prep = self._prepared(query.tenant, query.params, query.up_to_context, request_id, question, query.history)
        self._check_room()
        await self._retrieve(prep, k, m, deadline)
        if on_prompt is not None:
            on_prompt(PromptFacts(prep.history_turns_kept, prep.config.max_new_tokens))
        async for chunk in self._decode(prep, deadline):
            yield chunk

    async def _generate(self, query: GenerateQuery, deadline: float | None = None,
                        request_id: str | None = None) -> AsyncGenerator[AnswerChunk]:
        limits = self.limits
        prep = self._prepared(query.tenant, query.params, query.up_to_context, request_id)
        prep.prompt_ids = await self.render.ids(query.prompt)
        fill_room(prep, self.context_tokens, limits)
        self._check_fits(prep.prompt_ids, prep.config)
        refs = [t for t in query.references if t]
        if len(refs) + bool(query.reference_ids) > limits.max_references:
            raise InvalidArgument(f"too many references; the limit is {limits.max_references}")
        limits.check_prompt_chars("references", sum(map(len, refs)))
        references = [list(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in refs]
        if query.reference_ids:
            check_in_vocab(query.reference_ids, self.vocab_size, "reference token", InvalidArgument)
            references.append(list(query.reference_ids))
        limits.check_reference_tokens(sum(map(len, references)))
        self._check_room()
        prep.references = references
        async for chunk in self._decode(prep, deadline):
            yield chunk

    # ---- steps ------------------------------------------------------------------------------------
    def _timeout(self, limit: float, deadline: float | None) -> float:
        if deadline is None:
            return limit
        return max(0.001, min(limit, deadline - time.monotonic() - DEADLINE_MARGIN_S))

    async def _retrieve(self, prep: Prepared, k: int, m: int, deadline: float | None) -> None:
        """``prep``'s prompt (grounding.py): the retriever's, else the conversation alone; then its answer's room."""
        prep.prefix_epoch = self.scheduler.prefix_epoch(prep.tenant)  # before: a forget meanwhile makes it stale
        timeout = self._timeout(self.settings.retrieve_timeout_s, deadline)
        if not await retrieve(self.retriever, self.tokenizer_id, prep, k, m, timeout):
            if self.metrics is not None:
                self.metrics.record_degraded("retriever")
            budget = context_room(self.context_tokens, prep.config.max_new_tokens)
            await asyncio.to_thread(fallback, self.tokenizer, prep, budget)  # rendered off the loop
        fill_room(prep, self.context_tokens, self.limits)
        self._check_fits(prep.prompt_ids, prep.config)

    async def _fetch(self, prep: Prepared, deadline: float | None) -> tuple[list[tuple[list[int], int]], bool]:
        if self.draft_cache is None or not prep.config.speculative or not self.settings.continuation_tokens:
            return [], self.draft_cache is not None
        refs = [t for r in prep.references for t in r]
        try:
            found = await self.draft_cache.fetch(
                prep.tenant, self.tokenizer_id, prep.prompt_ids, refs, self.settings.continuation_tokens,
                self._timeout(self.settings.fetch_timeout_s, deadline),
            )
        except Exception as exc:
            log.warning("draft cache unavailable (%s); decoding without tenant drafts", type(exc).__name__)
            if self.metrics is not None:
                self.metrics.record_degraded("draftcache")
            return [], False
        kept = [(list(c.ids), max(1, round(c.weight))) for c in found if out_of_vocab(c.ids, self.vocab_size) is None]
        if len(kept) < len(found):  # a cache filled with another vocabulary's ids: they never reach a forward
            log.warning("dropped %d draft-cache continuations with ids outside the vocabulary", len(found) - len(kept))
        return kept, True

    def _check_room(self) -> None:
        """Refuse at once, before any retrieval work, when the queue is already full."""
        if not self.scheduler.has_room():
            waiting = self.scheduler.state().waiting
            raise ResourceExhausted(f"overloaded: {waiting} requests waiting (limit {self.settings.max_waiting})")

    async def _decode(self, prep: Prepared, deadline: float | None) -> AsyncGenerator[AnswerChunk]:
        continuations, drafts_ok = await self._fetch(prep, deadline)
        trie = TokenTrie(prep.config.trie)
        attribution = DraftAttribution(prep.prompt_ids, prep.references, [c for c, _ in continuations])
        bridge = Bridge()  # the scheduler's thread -> this request's event loop
        epoch = self.scheduler.prefix_epoch(prep.tenant) if prep.prefix_epoch is None else prep.prefix_epoch
        req = ServeRequest(
            prep.prompt_ids, prep.config, tenant=prep.tenant, trie=trie, references=prep.references,
            deadline=deadline, on_tokens=bridge.on_tokens, on_done=bridge.on_done, prefix_epoch=epoch,
        )
        # the trie is built here, off the engine's thread: a large reference never stalls another's step
        await asyncio.to_thread(fill_trie, req, continuations)
        try:
            self.scheduler.submit(req)
        except QueueFull as exc:
            raise ResourceExhausted(f"overloaded: {exc}") from None
        except KVTooLong as exc:  # its KV could never fit the tenant's share: the caller's input
            raise InvalidArgument(str(exc)) from None
        except SchedulerClosed as exc:
            raise Unavailable(str(exc)) from None
        streamer = TextStreamer(self.tokenizer, prep.config.stop_strings)
        output: list[int] = []
        done = False
        try:
            while True:
                message = await bridge.get()
                if isinstance(message, Ended):
                    done = True
                    if isinstance(message.error, RequestExpired):
                        raise DeadlineExceeded(str(message.error))
                    if isinstance(message.error, KVTooLong):  # longer than the backend's KV slot: the caller's input
                        raise InvalidArgument(str(message.error))
                    if message.error is not None:
                        raise message.error
                    break
                new = list(message.ids)
                context_before = prep.prompt_ids[-prep.config.max_match:] + output
                attribution.count_step(context_before, new)
                output.extend(new)
                text = streamer.push(new)
                yield TextDelta(text=text, token_ids=message.ids, logprobs=message.logprobs)
            tail = streamer.finish()
            if tail:
                yield TextDelta(text=tail)
        finally:
            if not done:  # the client went away or the deadline passed: its place frees within one step
                self.scheduler.cancel(req)
        stats = self._stats(req.stats, req.submitted, prep, drafts_ok, attribution)
        log_text(log, streamer.text, "answer")
        log.info("answered: %d tokens in %d steps (%.2f tokens/step, %.0f ms, waited %.0f ms, batch %.1f)",
                 stats.new_tokens, stats.forward_steps, stats.mean_accepted_per_step, stats.wall_s * MS,
                 stats.queue_wait_s * MS, stats.mean_batch_size)
        self._record(req.stats, stats, attribution, len(prep.prompt_ids))
        v = await self.check(streamer.text, prep.documents, prep.question)
        final = FinalInfo(request_id=prep.request_id, stats=stats, answer_text=v.answer_text,
                          documents=prep.documents, prompt_ids=tuple(prep.prompt_ids), output_ids=tuple(output),
                          citations=v.citations, grounded=v.grounded, retracted=v.retracted)
        if stats.finish_reason != "cancelled":
            self._publish(prep, final)
        yield final

    def _stats(self, st: ServeStats, submitted: float, prep: Prepared, drafts_ok: bool,
               attribution: DraftAttribution) -> GenerationStats:
        return GenerationStats(
            new_tokens=st.new_tokens, forward_steps=st.forward_steps,
            mean_accepted_per_step=st.mean_accepted_per_step, prefill_s=st.prefill_s,
            wall_s=time.perf_counter() - prep.started,
            time_to_first_token_s=(submitted - prep.started + st.first_token_s) if st.first_token_s else 0.0,
            documents_available=prep.documents_available,
            drafts_available=drafts_ok, finish_reason=st.finish_reason,
            draft_tokens_from_prompt=attribution.hits["prompt"],
            draft_tokens_from_cache=attribution.hits["tenant_cache"],
            draft_tokens_from_references=attribution.hits["references"],
            queue_wait_s=st.queue_wait_s, prefix_hit_tokens=st.prefix_hit_tokens,
            mean_batch_size=st.mean_batch_size, max_batch_size=max(st.batch_sizes, default=0),
            mean_tokens_per_forward=st.mean_tokens_per_forward, mean_draft_budget=st.mean_budget,
            kernel=",".join(sorted(st.kernels)),
            sampled=st.sampled, seed=st.seed or 0, unverified=st.unverified,
            history_turns_kept=prep.history_turns_kept, max_new_tokens=prep.config.max_new_tokens,
        )

    def _record(self, st: ServeStats, stats: GenerationStats, attribution: DraftAttribution, prompt: int) -> None:
        request_spans(st, self.model_name)  # queue, prefill and decode in the request's trace (tracing on)
        if self.metrics is not None:  # services/generator/metrics.py: vLLM-named request metrics too
            self.metrics.record_request(self.model_name, st, stats, dict(attribution.hits), prompt)

    def _publish(self, prep: Prepared, final: FinalInfo) -> None:
        if self.publisher is None:
            return
        event = completed_event(prep, final, self.tokenizer_id, self.model_name, uuid.uuid4().hex,
                                int(time.time() * MS))
        try:
            self.publisher.publish(event)
        except Exception:  # the answer is already out: a bus failure must not fail it
            log.exception("could not publish GenerationCompleted %s", event.event_id)
