"""Fixtures of the decoding-core tests (plain helpers live in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run several times faster on one intra-op thread (no OpenMP hand-offs on a busy box).

    List it in a module's ``pytestmark = pytest.mark.usefixtures("one_thread")`` (or on one test).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
