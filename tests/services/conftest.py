"""Fixtures for the service tests (retriever, draft cache, ops): models loaded once per process."""

from __future__ import annotations

from typing import Any

import pytest

from services.retriever.embeddings import Embedder
from tests.services.retriever_helpers import shared_embedder, shared_tokenizer


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """all-MiniLM-L6-v2 (``shared_embedder``: one per process)."""
    return shared_embedder()


@pytest.fixture(scope="session")
def tok() -> Any:
    """The served model's tokenizer (``shared_tokenizer``: one per process)."""
    return shared_tokenizer()
