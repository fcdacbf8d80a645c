"""Bus fixtures shared by every test folder (registered in ``tests/conftest.py``): the tansu broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lookahead_rag.services.events.kafka.broker import LocalBroker
from tests.kafka.helpers import require_tansu


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """One tansu broker on a free port for the whole test module (started on first use; skips the
    test when the bundled broker is not installed)."""
    binary = require_tansu()
    log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with LocalBroker(binary=binary, log_path=log_path) as running:
        yield running
