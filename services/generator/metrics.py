"""The generator's metrics: tokens, forward steps, tokens per step, first-token latency, speed, draft
sources, and the serving engine's queue and batches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry

from lookahead_rag.services.common.metric_group import LATENCY_BUCKETS, MetricGroup

ACCEPTED_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500)
FORWARD_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # tokens in one batched forward
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32)  # draft tokens granted to one request for one step
DRAFT_SOURCES = ("prompt", "tenant_cache", "references")


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
