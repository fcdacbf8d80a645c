"""``[generator]`` settings translated to the engine's ``SchedulerConfig`` (the one place that maps them)."""

from __future__ import annotations

from lookahead_core.serving import SchedulerConfig, usable_cores

from lookahead_rag.services.generator.settings import GeneratorSettings

# [generator] settings passed to the engine's SchedulerConfig under the same name
ENGINE_FIELDS = ("max_running", "max_waiting", "max_tokens_per_forward", "prefill_chunk", "ttft_target_s",
                 "prefill_tree_share", "backend", "exact_numerics", "exact_tile_rows", "kv_slot_tokens", "kv_dtype",
                 "kv_tenant_share", "max_running_per_tenant", "lend_places", "usage_half_life_s", "prefill_lead_s")
MIB = 1 << 20


def scheduler_config(s: GeneratorSettings) -> SchedulerConfig:
    """The engine's config for ``s``: same-named fields as they are, sizes in MiB to bytes, threads resolved."""
    same = {name: getattr(s, name) for name in ENGINE_FIELDS}  # [generator] fields named as the engine's
    return SchedulerConfig(
        **same, prefix_cache_bytes=s.prefix_cache_mb * MIB, prefix_tenant_share=s.prefix_cache_tenant_share,
        adaptive=s.adaptive_speculation, calibrate=s.calibrate_kernels, threads=s.threads or usable_cores(),
        kv_budget_bytes=s.kv_budget_mb * MIB,
    )
