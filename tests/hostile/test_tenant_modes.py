"""Issue 32 item 3: a tenant-chosen mode no longer slows everyone. ``draft-model`` and ``mjsd`` run a draft
model's forwards inside every shared step; a request may ask only for the server's default mode, ``none``,
or what the operator lists for its tenant in ``[generator] tenant_modes`` (``*``: every tenant). Anything
else is a one-line INVALID_ARGUMENT naming the mode and the tenant.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.generator.domain import GenerationParams
from lookahead_rag.services.generator.settings import GeneratorSettings

SETTINGS = {"tenant_modes": {"research": ["draft-model", "mjsd"], "*": ["jacobi"]}}


def check(mode: str, tenant: str, settings: GeneratorSettings | None = None) -> None:
    from lookahead_rag.services.generator.params import check_mode  # the check the fix adds

    check_mode(GenerationParams(mode=mode), tenant, settings or GeneratorSettings(**SETTINGS))


@pytest.mark.parametrize("mode", ["draft-model", "mjsd", "parallel"])
def test_an_expensive_mode_the_operator_did_not_allow_is_refused(mode: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check(mode, "evil")
    assert f"mode {mode!r} is not allowed for tenant 'evil'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("mode", "tenant"), [
    ("", "evil"), ("hierarchical", "evil"), ("none", "evil"),  # the server's default and none: everyone
    ("jacobi", "evil"),  # listed for every tenant
    ("draft-model", "research"), ("mjsd", "research"),  # listed for this tenant
])
def test_the_default_none_and_the_listed_modes_are_served(mode: str, tenant: str) -> None:
    check(mode, tenant)


def test_by_default_only_the_default_mode_and_none() -> None:
    settings = GeneratorSettings()
    check("none", "anyone", settings)
    for mode in ("draft-model", "jacobi", "llma"):
        with pytest.raises(InvalidArgument):
            check(mode, "anyone", settings)


def test_an_unknown_mode_in_the_allowlist_is_a_configuration_error() -> None:
    with pytest.raises(ValidationError, match="beam"):
        GeneratorSettings(tenant_modes={"acme": ["beam"]})
