"""Draft cache configuration: one pydantic-settings model, overridable by ``LAR_DRAFTCACHE_*`` variables.

Memory is bounded per (tenant, tokenizer) scope by ``node_capacity`` trie nodes (roughly 150-300
bytes each) plus ``max_references`` outputs of at most ``max_reference_tokens`` ids, and there are at
most ``max_tenants * max_tokenizers_per_tenant`` scopes: past ``max_tenants`` the least recently
used tenant (by Fetch or AddOutput) is evicted to make room for a new one.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from lookahead_core.config import TrieConfig
from lookahead_core.defaults import cache_dir
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.ports import DRAFTCACHE_GRPC_PORT, DRAFTCACHE_METRICS_PORT
from lookahead_rag.services.common.settings import ServerSettings, metrics_port_field, port_field

SNAPSHOT_FILE = "draftcache.snapshot"  # file name of the snapshot inside data_dir


def default_data_dir() -> Path:
    """``$LOOKAHEAD_RAG_CACHE/draftcache`` or ``~/.cache/lookahead-rag/draftcache``."""
    return cache_dir() / "draftcache"


class DraftCacheSettings(ServerSettings):
    model_config = SettingsConfigDict(env_prefix="LAR_DRAFTCACHE_")
    section: ClassVar[str] = "draftcache"

    port: int = port_field(DRAFTCACHE_GRPC_PORT)
    metrics_port: int | None = metrics_port_field(DRAFTCACHE_METRICS_PORT)

    data_dir: Path | None = Field(
        default_factory=default_data_dir,
        description="where the snapshot persists (restored on start); None keeps everything in memory",
    )
    branch_length: int = Field(12, ge=2, description="tokens per window inserted into a tenant trie")
    node_capacity: int = Field(50_000, ge=16, description="trie nodes per tenant and tokenizer; rarest pruned past it")
    prune_slack: float = Field(0.25, gt=0.0, lt=1.0, description="prune to (1 - slack) * capacity: fewer trie walks")
    max_references: int = Field(1000, ge=0, description="latest distinct outputs kept whole per tenant and tokenizer")
    max_reference_tokens: int = Field(4096, ge=1, description="an output kept whole is cut to this many tokens")
    max_event_ids: int = Field(100_000, ge=1, description="applied event ids kept per tenant (oldest forgotten first)")
    max_rebuild_tokens: int = Field(
        32_768, ge=1, description="most logged tokens a forget rebuilds a scope from (its newest outputs; older go)"
    )
    default_budget: int = Field(512, ge=1, description="tokens a Fetch returns when it says budget=0")
    max_budget: int = Field(8192, ge=1, description="largest budget a Fetch may ask for")
    similarity_ngram: int = Field(4, ge=1, description="n-gram length scoring past outputs against the request")
    min_shared_ngrams: int = Field(2, ge=1, description="n-grams a past output must share to be returned whole")
    max_ngram_outputs: int = Field(200, ge=1, description="an n-gram in more stored outputs is too common to score")
    max_whole_outputs: int = Field(4, ge=0, description="past outputs returned whole per Fetch at most")
    whole_output_share: float = Field(0.75, ge=0.0, le=1.0, description="budget share for past outputs returned whole")
    seed_ngrams: tuple[int, ...] = Field((3, 2), min_length=1, description="trie seed n-gram lengths, longest first")
    max_seed_children: int = Field(4, ge=1, description="continuations considered under one seed n-gram")
    max_chain_tokens: int = Field(64, ge=2, description="longest chained continuation one Fetch returns, seed included")
    max_request_ids: int = Field(131_072, ge=1, description="most ids in a Fetch (prompt + references) or an AddOutput")
    max_tenants: int = Field(1000, ge=1, description="tenants held; a new one past it evicts the least recently used")
    max_tokenizers_per_tenant: int = Field(4, ge=1, description="tokenizer ids held per tenant")
    max_name_chars: int = Field(256, ge=1, description="longest tokenizer id or event id accepted (tenants: [limits])")
    snapshot_interval_s: float = Field(60.0, ge=0.0, description="write the snapshot this often if changed (0: never)")

    @model_validator(mode="after")
    def _consistent(self) -> DraftCacheSettings:
        if self.default_budget > self.max_budget:
            raise ValueError(f"default_budget ({self.default_budget}) exceeds max_budget ({self.max_budget})")
        if any(n < 1 or n >= self.branch_length for n in self.seed_ngrams):
            raise ValueError(f"seed_ngrams {self.seed_ngrams} must lie in [1, branch_length)")
        return self

    def trie_config(self) -> TrieConfig:
        """The TrieConfig of every tenant trie."""
        return TrieConfig(branch_length=self.branch_length, capacity=self.node_capacity, prune_slack=self.prune_slack)

    def snapshot_path(self) -> Path | None:
        """Where the snapshot lives, or None when nothing persists."""
        return None if self.data_dir is None else self.data_dir / SNAPSHOT_FILE
