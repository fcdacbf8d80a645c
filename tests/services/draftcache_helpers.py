"""Draft cache test helpers: tiny settings and a store filled from token lists."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore
from tests.builders import TOKENIZER

# Small on purpose: depth-4 tries and bigram seeds make expected continuations easy to write by hand.
SMALL = {
    "branch_length": 4,
    "seed_ngrams": (2,),
    "similarity_ngram": 2,
    "min_shared_ngrams": 2,
    "max_whole_outputs": 2,
    "whole_output_share": 0.5,
    "max_chain_tokens": 16,
    "default_budget": 32,
    "max_budget": 64,
    "max_request_ids": 256,
}


def small_settings(data_dir: Path | None = None, **overrides: Any) -> DraftCacheSettings:
    """Settings for hand-made token lists; nothing persists unless ``data_dir`` is given."""
    return DraftCacheSettings(data_dir=data_dir, **{**SMALL, **overrides})


def store_with(
    outputs: Iterable[tuple[str, Sequence[int]]],
    settings: DraftCacheSettings | None = None,
    tokenizer_id: str = TOKENIZER,
) -> DraftCacheStore:
    """A store with each (tenant, output ids) added once, event ids ``e0``, ``e1``, ... in order."""
    store = DraftCacheStore(settings or small_settings())
    for i, (tenant, ids) in enumerate(outputs):
        store.add_output(tenant, tokenizer_id, ids, f"e{i}")
    return store

