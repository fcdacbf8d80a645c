"""Tests that act as a hostile tenant (issue 22): each fails on code without its defence.

Each test module keeps its own fixtures; shared ones live in the other folders' conftest modules.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.services.retriever_helpers import shared_tokenizer
from tests.services.test_ops_tracing import exporter  # noqa: F401  (tracing on, into memory, for one test)


@pytest.fixture(scope="session")
def tok() -> Any:
    """The served model's tokenizer (``shared_tokenizer``: one per process, as tests/services' ``tok``)."""
    return shared_tokenizer()
