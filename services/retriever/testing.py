"""Helpers for tests and benchmarks: one embedder and tokenizer per process, small settings, events."""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Any

from lookahead_rag.v1 import events_pb2

from services.retriever.embeddings import Embedder
from services.retriever.settings import RetrieverSettings


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

    return load_tokenizer(model or RetrieverSettings.model_fields["model"].default)


def settings(data_dir: Path | None = None, **overrides: Any) -> RetrieverSettings:
    """RetrieverSettings for a test: in memory unless ``data_dir`` is given, never the user's cache."""
    return RetrieverSettings(data_dir=data_dir, **overrides)


def completed_event(
    tenant: str, question: str, answer: str, event_id: str | None = None
) -> events_pb2.GenerationCompleted:
    """A GenerationCompleted event as the generator would publish it (token ids left empty)."""
    return events_pb2.GenerationCompleted(
        event_id=event_id or uuid.uuid4().hex,
        tenant=tenant,
        question=question,
        answer_text=answer,
        created_unix_ms=0,
    )
