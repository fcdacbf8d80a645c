"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pipeline.helpers import LoopThread


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """One asyncio loop in a background thread per test module (pipelines on real gRPC run on it)."""
    thread = LoopThread()
    yield thread
    thread.close()
