"""bench hog's two rules without a model: how long the hog's prompts are, and how its targets are judged."""

from __future__ import annotations

from types import SimpleNamespace

from lookahead_core.engine.sched_config import MIB, SchedulerConfig

from lookahead_rag.bench.hog import CONTEXT_MARGIN, hog_prompt_tokens, targets
from tests.core.helpers import tiny_model


def scheduler(**cfg: object) -> SimpleNamespace:
    return SimpleNamespace(config=SchedulerConfig(calibrate=False, **cfg), model=tiny_model("llama"))  # type: ignore[arg-type]


def test_the_hog_prompt_is_the_longest_that_could_be_cached_admitted_and_fit_the_context() -> None:
    from lookahead_core.kv.kvstore import KVShape

    sched = scheduler(prefix_cache_bytes=MIB, prefix_tenant_share=0.5, kv_budget_bytes=64 * MIB)
    per_token = KVShape.of(sched.model).bytes_per_token
    # the prefix-cache share binds: half a MiB of KV
    assert hog_prompt_tokens(sched, context=10**6, max_new=4) == (MIB // 2) // per_token
    # the model's context binds: its answer and a step's margin left below it
    assert hog_prompt_tokens(sched, context=100, max_new=4) == 100 - 4 - CONTEXT_MARGIN
    # the tenant's request-KV share binds: a prompt past it would be refused, so the hog sends the most admitted
    sched = scheduler(prefix_cache_bytes=64 * MIB, kv_budget_bytes=2 * MIB, kv_tenant_share=0.5)
    assert hog_prompt_tokens(sched, context=10**6, max_new=4) == MIB // per_token - 4 - CONTEXT_MARGIN


def test_targets_compare_the_victim_beside_the_hog_with_it_alone() -> None:
    plain = {"prefix_hit_tokens": 1000, "ttft_p50_s": 0.50, "prefill_chunk_s": 0.20}
    # 5% fewer hits and 0.1 s later first tokens (half a chunk): both within
    ok = targets({"plain": plain, "hog": {"prefix_hit_tokens": 950, "ttft_p50_s": 0.60}})
    assert ok["prefix_hits_within"] and ok["ttft_within"] and ok["ttft_p50_rise_chunks"] == 0.5
    # 20% fewer hits and 0.5 s later (2.5 chunks): both missed
    bad = targets({"plain": plain, "hog": {"prefix_hit_tokens": 800, "ttft_p50_s": 1.00}})
    assert not bad["prefix_hits_within"] and not bad["ttft_within"] and bad["ttft_p50_rise_chunks"] == 2.5
    # no first token beside the hog: never within
    none = targets({"plain": plain, "hog": {"prefix_hit_tokens": 1000, "ttft_p50_s": None}})
    assert not none["ttft_within"] and none["ttft_p50_rise_s"] is None
