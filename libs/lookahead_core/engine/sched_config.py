"""How the engine batches, queues, caches and measures (``StepScheduler``'s one config value)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine batches, queues, caches and measures."""

    max_running: int = 16  # requests decoding at once (all verified in each step's one forward)
    max_waiting: int = 64  # requests queued beyond those; one more is refused at once (QueueFull)
    max_tokens_per_forward: int = 512  # tokens in one forward: drafts, roots and prefill chunks together
    prefill_chunk: int = 256  # prompt tokens prefilled per forward, so running streams keep streaming
    ttft_target_s: float = 2.0  # while prompts wait, trees shrink so each first token comes within this
    prefill_tree_share: float = 0.05  # while prompts prefill, trees add at most this share to a step's time
    prefix_cache_bytes: int = 256 * MIB  # KV of shared prompt prefixes kept per engine (LRU past it)
    prefix_min_tokens: int = 16  # shorter prefix matches are not worth copying
    prefix_tenant_share: float = 1.0  # fraction of prefix_cache_bytes one tenant may hold (its own LRU past it)
    adaptive: bool = True  # split each step's draft budget by measured acceptance and cost
    calibrate: bool = True  # measure kernels and the forward cost curve at start-up
    calibration_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # forward sizes timed
    calibration_past: int = 256  # cache entries behind the timed forwards (a typical RAG prompt)
    calibration_repeats: int = 3  # timings per size and kernel (the median is kept)
    idle_poll_s: float = 0.05  # an idle loop wakes this often to expire waiting deadlines
    threads: int = 0  # intra-op threads of the engine's own thread (0: the constructing thread's count)
    backend: str = "auto"  # what runs the forwards: "cpu" (kernel twins), "generic" (torch ops, a KV pool), "auto"
    exact_numerics: bool = False  # generic backend: fixed-shape forwards, so speculation is exact in bf16 too
    exact_tile_rows: int = 32  # exact_numerics: rows of every forward tile (one-token steps are padded to it)
    kv_slot_tokens: int = 2048  # generic backend: KV entries a request's pool slot holds (prompt + answer + a step)
    kv_dtype: str = "auto"  # cpu backend: a request cache's dtype (forward.backend.kv_dtype: auto, model, float16)
    kv_budget_bytes: int = 2048 * MIB  # request KV (the backend's kv_bytes) running requests may hold; past it, wait
    kv_tenant_share: float = 0.5  # of kv_budget_bytes one tenant's running requests may hold
    max_running_per_tenant: int = 0  # running requests one tenant may hold (0: three quarters of max_running)
    lend_places: bool = True  # a tenant alone may fill every place, paused back to its share when another waits
    usage_half_life_s: float = 10.0  # how fast a tenant's recent engine time is forgotten (least used prefills first)
    prefill_lead_s: float = 2.0  # engine seconds a tenant may be ahead of a decoding one and still prefill beside it

    @property
    def tenant_running(self) -> int:
        """Running requests one tenant may hold: the rest are kept for other tenants' arrivals."""
        return self.max_running_per_tenant or max(1, self.max_running - self.max_running // 4)

    @property
    def tenant_kv_bytes(self) -> int:
        """Request KV one tenant's running requests may hold."""
        return int(self.kv_budget_bytes * self.kv_tenant_share)

    def __post_init__(self) -> None:
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError("need max_running >= 1 and max_waiting >= 0")
        if self.max_tokens_per_forward < self.max_running + 1:
            raise ValueError("max_tokens_per_forward must exceed max_running (one token per request and room)")
        if not 1 <= self.prefill_chunk <= self.max_tokens_per_forward or not self.ttft_target_s > 0:
            raise ValueError("need 1 <= prefill_chunk <= max_tokens_per_forward and ttft_target_s > 0")
        if self.kv_budget_bytes < 1 or not 0 < self.kv_tenant_share <= 1 or self.max_running_per_tenant < 0:
            raise ValueError("need kv_budget_bytes >= 1, 0 < kv_tenant_share <= 1 and max_running_per_tenant >= 0")
        if not self.usage_half_life_s > 0 or not self.prefill_lead_s >= 0:
            raise ValueError("need usage_half_life_s > 0 and prefill_lead_s >= 0")
        if not self.prefill_tree_share >= 0:
            raise ValueError("prefill_tree_share must be >= 0 (inf: trees are not capped while prompts prefill)")
