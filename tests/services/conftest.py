"""Fixtures for the service tests (retriever, draft cache, ops): models loaded once per process."""

from __future__ import annotations

import os
from typing import Any

import pytest

from lookahead_rag.services.retriever.embeddings import Embedder
from tests.services.retriever_helpers import shared_embedder, shared_tokenizer
from tests.services.tls_helpers import Pki, make_pki


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """all-MiniLM-L6-v2 (``shared_embedder``: one per process)."""
    return shared_embedder()


@pytest.fixture(scope="session")
def tok() -> Any:
    """The served model's tokenizer (``shared_tokenizer``: one per process)."""
    return shared_tokenizer()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for the TLS tests, made at run time (tls_helpers.make_pki), once per module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def no_lar_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's settings are its own: no LAR_* variable or $LAR_CONFIG from the caller."""
    for var in list(os.environ):
        if var.upper().startswith("LAR_"):
            monkeypatch.delenv(var)
