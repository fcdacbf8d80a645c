"""Fixtures of the HTTP endpoint tests: each module starts its own pipeline (``pipe``, with
``tests.pipeline.helpers.module_pipeline``) and its tests run on the module's loop."""

from __future__ import annotations

import pytest

from tests.pipeline.helpers import RunningPipeline


@pytest.fixture
def tenant(request: pytest.FixtureRequest, pipe: RunningPipeline) -> str:
    """A tenant of its own with ``DOCS`` ingested, in the requesting module's ``pipe``."""
    return pipe.new_tenant(request.node.name)
