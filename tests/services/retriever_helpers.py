"""Retriever test helpers: one embedder and tokenizer per process, settings that never touch the user's cache."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from lookahead_rag.services.common.model_settings import ModelSettings
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.settings import RetrieverSettings


@functools.cache
def shared_embedder() -> Embedder:
    """all-MiniLM-L6-v2, loaded once per process (a few seconds)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return Embedder()


@functools.cache
def shared_tokenizer(model: str | None = None) -> Any:
    """The served model's tokenizer, loaded once per process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lookahead_core.models import load_tokenizer

    return load_tokenizer(model or ModelSettings().name)  # the served one: the 135M the tests pin


def settings(data_dir: Path | None = None, **overrides: Any) -> RetrieverSettings:
    """RetrieverSettings for a test: in memory unless ``data_dir`` is given, never the user's cache."""
    return RetrieverSettings(data_dir=data_dir, **overrides)

