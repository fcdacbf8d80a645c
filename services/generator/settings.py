"""Generator settings (env prefix LAR_GENERATOR_, or the [generator] table of the TOML config)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from lookahead_core import LOSSY_MODES, MJSD_BEAMS, MJSD_THRESHOLD, parse_mode
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.ports import GENERATOR_GRPC_PORT, GENERATOR_METRICS_PORT
from lookahead_rag.services.common.settings import ServerSettings, metrics_port_field, port_field

MIB = 1 << 20
# Default share of the prefix cache one tenant may hold. 1.0: a lone tenant may use all of it (0.5 cost one
# tenant 30% of its prefix hits and 27% on TTFT p50 in bench serve at 16 clients); eviction past the total
# still takes the heaviest tenant's entries first, so no tenant flushes a lighter one. Set <= 1/N for hard
# budgets that also hide other tenants' volume from eviction timing (docs/SECURITY.md).
PREFIX_TENANT_SHARE = 1.0
REFUSAL = "The documents do not say."  # the retriever's default system prompt asks for these words


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "lookahead-rag" / "generator"


class GeneratorSettings(ServerSettings):
    """How the generator decodes, what it accepts and where its dependencies are."""

    model_config = SettingsConfigDict(env_prefix="LAR_GENERATOR_")
    renamed: ClassVar[dict[str, str]] = {"draft_budget": "continuation_tokens"}  # old name -> new (read, warned)
    section: ClassVar[str] = "generator"

    port: int = port_field(GENERATOR_GRPC_PORT)
    metrics_port: int | None = metrics_port_field(GENERATOR_METRICS_PORT)
    data_dir: Path = Field(default_factory=default_data_dir, description="outbox and local state")
    retriever_target: str = Field("", description="retriever HOST:PORT; empty = in-process retriever")
    draftcache_target: str = Field("", description="draft cache HOST:PORT; empty = in-process draft cache")
    retrieve_timeout_s: float = Field(2.0, gt=0, description="deadline of one Retrieve call")
    fetch_timeout_s: float = Field(0.5, gt=0, description="deadline of one draft-cache Fetch call")
    max_running: int = Field(16, gt=0, description="requests decoding at once, all verified in one forward per step")
    max_waiting: int = Field(64, ge=0, description="requests queued past max_running; more get RESOURCE_EXHAUSTED")
    max_tokens_per_forward: int = Field(512, gt=1, description="tokens in one batched forward (drafts + prefill)")
    prefill_chunk: int = Field(256, gt=0, description="prompt tokens prefilled per forward while others decode")
    ttft_target_s: float = Field(2.0, gt=0, description="time to first token the step budget keeps waiting "
                                 "prompts within: while they wait, draft trees shrink")
    prefill_tree_share: float = Field(0.05, ge=0, description="while prompts prefill, draft trees add at most this "
                                      "share to a step's time, so first tokens come about as soon as without them")
    prefix_cache_mb: int = Field(256, ge=0, description="MiB of prompt-prefix KV kept for reuse, all tenants together")
    prefix_cache_tenant_share: float = Field(
        PREFIX_TENANT_SHARE, gt=0, le=1, description="fraction of prefix_cache_mb one tenant may hold (its own "
        "least recently used prefixes go first past it)"
    )
    adaptive_speculation: bool = Field(True, description="size draft trees by measured acceptance and cost")
    calibrate_kernels: bool = Field(True, description="time the kernels at start-up and pick per forward size")
    backend: Literal["auto", "cpu", "generic"] = Field(
        "auto", description="what runs the forwards: cpu (kernel twins, C++ kernels), generic (torch ops only, one "
        "KV pool, one attention call a layer: GPUs), auto (cpu on a CPU model, generic elsewhere or when exact)")
    exact_numerics: bool = Field(False, description="generic backend: every forward in fixed tiles with width-"
                                 "independent attention, so speculation gives one-token decoding's tokens in bf16")
    exact_tile_rows: int = Field(32, ge=1, description="exact_numerics: rows of every forward tile (a one-token "
                                 "step is padded to it)")
    kv_budget_mb: int = Field(2048, ge=1, description="MiB of request KV all running requests may hold (each counts "
                              "what its backend holds for it: prompt + max_new_tokens + a step, on the generic "
                              "backend a whole kv_slot_tokens slot); past it requests wait in the queue")
    kv_tenant_share: float = Field(0.5, gt=0, le=1, description="fraction of kv_budget_mb one tenant's running "
                                   "requests may hold; a request needing more is refused (INVALID_ARGUMENT)")
    # the proxy's PROXY_TENANT_MAX_IN_FLIGHT (deploy/haproxy, default 4) caps one tenant's calls over all
    # replicas before they get here: keep it well below this per-replica place count (below max_running)
    max_running_per_tenant: int = Field(0, ge=0, description="running requests one tenant may hold (0: three "
                                        "quarters of max_running, so other tenants' arrivals always find a place)")
    lend_places: bool = Field(True, description="a tenant alone may fill every running place; when another "
                              "tenant's request waits, a lent place is given back (its newest request paused, kept)")
    usage_half_life_s: float = Field(10.0, gt=0, description="how fast a tenant's recent engine time is forgotten: "
                                     "each step's prompt room goes to the tenants that used least of it lately")
    prefill_lead_s: float = Field(2.0, ge=0, description="engine seconds a tenant may have used beyond a tenant "
                                  "decoding now and still prefill beside its steps (more: its prompt waits)")
    kv_slot_tokens: int = Field(2048, ge=1, description="generic backend: KV entries of one request's pool slot "
                                "(prompt + max_new_tokens + a step must fit, else INVALID_ARGUMENT)")
    kv_dtype: Literal["auto", "model", "float16"] = Field(
        "auto", description="cpu backend: what a request's KV holds: float16 (half the bytes; only where every "
        "forward attends by the C++ kernel: a model on quantized weights), model (the weights' dtype), auto "
        "(float16 where it can be, else model)")
    mode: str = Field(
        "hierarchical", description="default draft mode: hierarchical|parallel|llma|jacobi|draft-model|none "
        "(mjsd is lossy: per request, by name, never the default)"
    )
    tenant_modes: dict[str, list[str]] = Field(
        default={}, description="draft modes a tenant's requests may ask for besides the default mode and none "
        "({tenant = [modes]}; \"*\": every tenant): a draft model's modes add work to every tenant's steps"
    )
    decoding_length: int = Field(8, ge=0, description="default draft tokens per forward")
    max_decoding_length: int = Field(32, ge=0, description="most draft tokens a confident copy may grow to")
    branch_length: int = Field(32, ge=2, description="trie branch length")
    # the Jacobi lookahead branch (lookahead_core/jacobi.py): mode jacobi, or hierarchical with jacobi_window > 0
    jacobi_window: int | None = Field(
        None, ge=0, description="Jacobi window W: guesses per row (unset: what the measured forward cost allows; "
        "0: none in hierarchical)"
    )
    jacobi_ngram: int = Field(3, ge=2, description="Jacobi n-gram size N (the window has N - 1 rows)")
    jacobi_guesses: int = Field(2, ge=1, description="Jacobi pool n-grams drafted per step at most (G)")
    # mode draft-model (lookahead_core/draft_model.py): a draft model's token tree merged with the trie's
    draft_model: str = Field("", description="draft model path or hub id, same tokenizer ('': self-draft)")
    draft_layers: int = Field(0, ge=0, description="self-draft exit layer (0: a quarter of the model's layers)")
    draft_top_k: int = Field(2, ge=1, description="draft-model tree: children proposed per depth")
    draft_depth: int = Field(4, ge=1, description="draft-model tree: depths proposed (one draft forward each)")
    # mode mjsd (lookahead_core/mjsd.py; LOSSY, per request only): beam search on the draft, joint acceptance
    mjsd_beams: int = Field(MJSD_BEAMS, ge=1, le=64, description="mjsd: beams of the draft's beam search")
    mjsd_threshold: float = Field(
        MJSD_THRESHOLD, gt=0, le=1, description="mjsd: accept a prefix when P_target / P_draft >= this"
    )
    continuation_tokens: int = Field(4096, ge=0, description="tokens of tenant-cache continuations fetched per "
                                     "request (was draft_budget, still read: a step's draft budget is another thing)")
    max_message_bytes: int = Field(8 * MIB, gt=0, description="largest gRPC message sent or received")
    stream_send_timeout_s: float = Field(30.0, gt=0, description="a gRPC or HTTP stream whose client takes no "
                                         "data for this long (it stopped reading) is cancelled, its slot freed")
    threads: int = Field(0, ge=0, description="torch CPU threads of the engine's step thread (0 = every core "
                         "this process may use); the process's other threads run torch on one")
    # side-channel-safe streams (services/generator/safe_stream.py, docs/SECURITY.md)
    safe_stream_tenants: list[str] = Field(
        default=[], description="tenants whose answers always stream in the side-channel-safe mode"
    )
    safe_stream_interval_ms: float = Field(
        200.0, gt=0, description="safe stream: one chunk per tick of this many ms (longer than decoding a chunk)"
    )
    safe_stream_chunk_tokens: int = Field(4, ge=1, le=256, description="safe stream: tokens per chunk")
    # answers no passage supports (services/retriever/grounded.py; services/generator/verdict.py)
    ungrounded: Literal["flag", "abstain"] = Field(
        "flag", description="an answer the passages do not support: flag (grounded = false, the page marks it "
        "unsupported) or abstain (replaced by refusal; a streamed one is retracted by its final message)")
    refusal: str = Field(REFUSAL, min_length=1, description="what an abstained answer says (the words the "
                         "retriever's system prompt asks the model to use)")
    # behind a proxy that routes by tenant (deploy/haproxy, deploy/k8s/routing; docs/SECURITY.md)
    tenant_routing: bool = Field(False, description="replicas behind a proxy hashing x-tenant: every gRPC and "
                                 "HTTP call must send it, once (INVALID_ARGUMENT / 400 otherwise)")

    @model_validator(mode="after")
    def _limits_agree(self) -> GeneratorSettings:
        if self.max_tokens_per_forward <= self.max_running:
            raise ValueError(f"max_tokens_per_forward {self.max_tokens_per_forward} must exceed "
                             f"max_running {self.max_running}")
        if self.prefill_chunk > self.max_tokens_per_forward:
            raise ValueError(f"prefill_chunk {self.prefill_chunk} is over "
                             f"max_tokens_per_forward {self.max_tokens_per_forward}")
        if parse_mode(self.mode) in LOSSY_MODES:
            raise ValueError(f"mode {self.mode} is lossy (its output may differ from plain decoding): it cannot be "
                             "the server's default; a request asks for it by name")
        for modes in self.tenant_modes.values():
            for mode in modes:
                parse_mode(mode)  # an unknown name is a configuration error, not a silent refusal later
        if self.decoding_length > self.max_decoding_length:
            raise ValueError(f"decoding_length {self.decoding_length} is over "
                             f"max_decoding_length {self.max_decoding_length}")
        return self
