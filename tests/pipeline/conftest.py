"""Fixtures shared by the pipeline test modules.

Each module starts the pipelines it needs in its own module-scoped async fixtures (``pipe`` and
others, each with its own settings), on the module's event loop; its tests run on that loop too
(``module_loop`` in tests/pipeline/helpers.py).
"""

from __future__ import annotations

import pytest

from tests.pipeline.helpers import RunningPipeline, unique_tenant


@pytest.fixture
def tenant_name(request: pytest.FixtureRequest) -> str:
    """A tenant name no other test uses, with nothing ingested."""
    return unique_tenant(request.node.name)


@pytest.fixture
def tenant(request: pytest.FixtureRequest, pipe: RunningPipeline) -> str:
    """A tenant of its own with ``DOCS`` ingested, in the requesting module's ``pipe``."""
    return pipe.new_tenant(request.node.name)
