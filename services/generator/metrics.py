"""The generator's metrics: tokens, forward steps, tokens per step, first-token latency, speed, draft
sources, and the serving engine's queue and batches; and ``RequestMetrics``: each finished request by
vLLM's names and meanings (``vllm:e2e_request_latency_seconds`` is ``lookahead_rag_e2e_request_latency_seconds``
here), labelled with ``model_name``, so dashboards and alerts written for vLLM carry over.

    GeneratorMetrics.of(registry).record_request(model_name, serve_stats, stats, draft_hits, prompt_tokens)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.telemetry.metric_group import LATENCY_BUCKETS, MetricGroup

if TYPE_CHECKING:
    from lookahead_core.serving import ServeStats

    from lookahead_rag.services.generator.domain import GenerationStats

ACCEPTED_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500)
FORWARD_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # tokens in one batched forward
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32)  # draft tokens granted to one request for one step
DRAFT_SOURCES = ("prompt", "tenant_cache", "references")
OTHER_SOURCE = "other"  # accepted draft tokens found in none of DRAFT_SOURCES (Jacobi n-grams, a draft model)
SPEC_SOURCES = (*DRAFT_SOURCES, OTHER_SOURCE)  # the ``source`` label of spec_decode_num_accepted_tokens
# request-level buckets, in the spirit of vLLM's (seconds, then token counts)
REQUEST_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
                           120.0, 240.0, 480.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                         2.5, 5.0, 10.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
MODEL = ("model_name",)  # vLLM's label: the served model ([model] name)
UNKNOWN_REASON = "unknown"  # finished_reason of a request that ended without one


class EngineMetrics(Protocol):
    """What the generator's engine records (``GeneratorMetrics`` below)."""

    def record_forward(self, tokens: int, batch: int) -> None: ...

    def observe_engine(self, waiting: int, running: int, kv_bytes: int) -> None: ...

    def record_degraded(self, dependency: str) -> None: ...

    def record_request(self, model_name: str, st: ServeStats, stats: GenerationStats, draft_hits: Mapping[str, int],
                       prompt_tokens: int) -> None: ...


class GeneratorMetrics(MetricGroup):
    """Decoding: tokens, forward steps, tokens per step, first-token latency, speed, draft sources."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.new_tokens = self.counter("generator_new_tokens", "tokens generated")
        self.forward_steps = self.counter("generator_forward_steps", "model forwards (one per draft tree)")
        self.accepted_per_step = self.histogram(
            "generator_accepted_tokens_per_step", "tokens one forward step emitted (accepted drafts + 1)",
            ACCEPTED_BUCKETS,
        )
        self.time_to_first_token = self.histogram(
            "generator_time_to_first_token_seconds", "request start to first streamed token", LATENCY_BUCKETS
        )
        self.tokens_per_second = self.histogram(
            "generator_tokens_per_second", "new tokens / decoding wall time, per answer", TOKENS_PER_S_BUCKETS
        )
        self.draft_hits = self.counter(
            "generator_draft_source_hits", "accepted draft tokens by where the draft came from", ("source",)
        )
        self.degraded = self.counter(
            "generator_degraded", "answers given without a dependency (down or past its deadline)",
            ("dependency",),
        )
        self.queue_depth = self.gauge("generator_queue_depth", "requests waiting in the engine's queue")
        self.running = self.gauge("generator_running_requests", "requests prefilling or decoding")
        self.kv_bytes = self.gauge("generator_kv_bytes", "KV-cache bytes held by running requests")
        self.tokens_per_forward = self.histogram(
            "generator_tokens_per_forward", "tokens in one batched forward (all requests)", FORWARD_TOKEN_BUCKETS
        )
        self.prefix_hit_tokens = self.counter(
            "generator_prefix_cache_hit_tokens", "prompt tokens whose KV came from the prefix cache"
        )
        self.draft_budget = self.histogram(
            "generator_draft_budget_tokens", "draft tokens granted to a request for one step", BUDGET_BUCKETS
        )
        for source in DRAFT_SOURCES:  # exported at 0 from the start, so rate() works at once
            self.draft_hits.labels(source)

    def record_steps(self, accepted_per_step: Iterable[int]) -> None:
        """One observation per forward step: the tokens that step emitted."""
        for accepted in accepted_per_step:
            self.accepted_per_step.observe(accepted)

    def record_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def record_answer(self, new_tokens: int, forward_steps: int, decode_s: float,
                      draft_hits: Mapping[str, int] | None = None) -> None:
        """A finished answer: totals, its speed, and accepted draft tokens per source (DRAFT_SOURCES)."""
        hits = dict(draft_hits or {})
        unknown = set(hits) - set(DRAFT_SOURCES)
        if unknown:  # checked first: a bad call records nothing
            raise ValueError(f"unknown draft source {sorted(unknown)} (one of {', '.join(DRAFT_SOURCES)})")
        self.new_tokens.inc(new_tokens)
        self.forward_steps.inc(forward_steps)
        if decode_s > 0 and new_tokens > 0:
            self.tokens_per_second.observe(new_tokens / decode_s)
        for source, count in hits.items():
            self.draft_hits.labels(source).inc(count)

    def record_forward(self, tokens: int, batch: int) -> None:
        """One batched forward of ``tokens`` tokens for ``batch`` requests (scheduler thread)."""
        self.tokens_per_forward.observe(tokens)

    def record_serving(self, budgets: Iterable[int], prefix_hit_tokens: int) -> None:
        """A finished request: the draft budget of each of its steps, its prefix-cache hit."""
        for budget in budgets:
            self.draft_budget.observe(budget)
        self.prefix_hit_tokens.inc(prefix_hit_tokens)

    def observe_engine(self, waiting: int, running: int, kv_bytes: int) -> None:
        """Sampled engine state (a Refresher job)."""
        self.queue_depth.set(waiting)
        self.running.set(running)
        self.kv_bytes.set(kv_bytes)

    def record_degraded(self, dependency: str) -> None:
        """An answer went on without ``dependency`` ("retriever" or "draftcache")."""
        self.degraded.labels(dependency).inc()

    def record_request(self, model_name: str, st: ServeStats, stats: GenerationStats, draft_hits: Mapping[str, int],
                       prompt_tokens: int) -> None:
        """A finished request (the engine's one call): the counters above, and ``RequestMetrics``."""
        self.record_steps(st.accepted_per_step)
        if stats.time_to_first_token_s:
            self.record_first_token(stats.time_to_first_token_s)
        self.record_answer(stats.new_tokens, stats.forward_steps, st.wall_s, draft_hits)
        self.record_serving(st.budgets, stats.prefix_hit_tokens)
        RequestMetrics.of(self.registry).record(model_name, st, stats, draft_hits, prompt_tokens)


class RequestMetrics(MetricGroup):
    """Each finished request by vLLM's metric names and meanings, labelled with ``model_name``.

    Times: e2e = request start (retrieval included) to the end of decoding; queue = submitted to
    admitted by the engine; time to first token = request start to the first token; prefill =
    admitted to the first token; decode = first token to the last; inference = admitted to the
    last. Inter-token latency is per engine step (a step may emit several tokens): each of a
    request's steps is observed at its mean step interval, so sums and means are exact. Speculation:
    draft tokens sent through the model, accepted ones by where the draft came from (``source``).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        seconds = self.histogram
        self.e2e = seconds("e2e_request_latency_seconds", "end-to-end request latency", REQUEST_SECONDS_BUCKETS, MODEL)
        self.queue = seconds("request_queue_time_seconds", "time waiting in the engine's queue",
                             REQUEST_SECONDS_BUCKETS, MODEL)
        self.ttft = seconds("time_to_first_token_seconds", "time to first token", TTFT_BUCKETS, MODEL)
        self.itl = seconds("inter_token_latency_seconds", "time between successive engine steps' output",
                           TOKEN_LATENCY_BUCKETS, MODEL)
        self.tpot = seconds("request_time_per_output_token_seconds", "a request's decode time per output token",
                            TOKEN_LATENCY_BUCKETS, MODEL)
        self.prefill = seconds("request_prefill_time_seconds", "admitted to first token", REQUEST_SECONDS_BUCKETS,
                               MODEL)
        self.decode = seconds("request_decode_time_seconds", "first token to last token", REQUEST_SECONDS_BUCKETS,
                              MODEL)
        self.inference = seconds("request_inference_time_seconds", "admitted to last token",
                                 REQUEST_SECONDS_BUCKETS, MODEL)
        self.prompt_hist = self.histogram("request_prompt_tokens", "prompt tokens of a request",
                                          TOKEN_COUNT_BUCKETS, MODEL)
        self.generation_hist = self.histogram("request_generation_tokens", "tokens a request generated",
                                              TOKEN_COUNT_BUCKETS, MODEL)
        self.prompt_tokens = self.counter("prompt_tokens", "prompt tokens processed", MODEL)
        self.generation_tokens = self.counter("generation_tokens", "tokens generated", MODEL)
        self.success = self.counter("request_success", "finished requests by finish reason (eos, stop, length, "
                                    "cancelled)", (*MODEL, "finished_reason"))
        self.draft_tokens = self.counter("spec_decode_num_draft_tokens", "draft tokens verified by the model",
                                         MODEL)
        self.accepted_tokens = self.counter("spec_decode_num_accepted_tokens",
                                            "draft tokens accepted, by where the draft came from",
                                            (*MODEL, "source"))

    def record(self, model_name: str, st: ServeStats, stats: GenerationStats, draft_hits: Mapping[str, int],
               prompt_tokens: int) -> None:
        """One finished request (``st``: the engine's stats, ``stats``: the reply's, ``draft_hits``:
        accepted draft tokens by DRAFT_SOURCES)."""
        self.e2e.labels(model_name).observe(stats.wall_s)
        self.queue.labels(model_name).observe(st.queue_wait_s)
        self.prefill.labels(model_name).observe(st.prefill_s)
        self.inference.labels(model_name).observe(max(0.0, st.wall_s - st.queue_wait_s))
        if stats.time_to_first_token_s:
            self.ttft.labels(model_name).observe(stats.time_to_first_token_s)
        if st.first_token_s:
            decode_s = max(0.0, st.wall_s - st.first_token_s)
            self.decode.labels(model_name).observe(decode_s)
            if st.forward_steps:
                itl = self.itl.labels(model_name)
                for _ in range(st.forward_steps):
                    itl.observe(decode_s / st.forward_steps)
            if stats.new_tokens > 1:
                self.tpot.labels(model_name).observe(decode_s / (stats.new_tokens - 1))
        self.prompt_hist.labels(model_name).observe(prompt_tokens)
        self.generation_hist.labels(model_name).observe(stats.new_tokens)
        self.prompt_tokens.labels(model_name).inc(prompt_tokens)
        self.generation_tokens.labels(model_name).inc(stats.new_tokens)
        self.success.labels(model_name, stats.finish_reason or UNKNOWN_REASON).inc()
        self.draft_tokens.labels(model_name).inc(st.draft_tokens)
        accepted = max(0, sum(st.accepted_per_step) - len(st.accepted_per_step))  # each step: accepted + 1
        attributed = 0
        for source in DRAFT_SOURCES:
            count = int(draft_hits.get(source, 0))
            attributed += count
            self.accepted_tokens.labels(model_name, source).inc(count)
        self.accepted_tokens.labels(model_name, OTHER_SOURCE).inc(max(0, accepted - attributed))
