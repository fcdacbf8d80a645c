"""Generator settings that shape the engine's steps reach its SchedulerConfig, and bad values are refused."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from lookahead_rag.services.generator.engine_config import scheduler_config
from lookahead_rag.services.generator.settings import GeneratorSettings


def test_the_prefill_tree_share_reaches_the_engine() -> None:
    assert scheduler_config(GeneratorSettings(prefill_tree_share=0.2)).prefill_tree_share == 0.2
    assert GeneratorSettings().prefill_tree_share == 0.05  # the default: trees add <= 5% while prompts prefill
    no_cap = GeneratorSettings(prefill_tree_share=math.inf)  # inf: trees are not capped while prompts prefill
    assert scheduler_config(no_cap).prefill_tree_share == math.inf


def test_a_negative_prefill_tree_share_is_refused() -> None:
    with pytest.raises(ValidationError, match="prefill_tree_share"):
        GeneratorSettings(prefill_tree_share=-1)


def test_every_engine_field_of_the_generator_reaches_the_engine() -> None:
    # each [generator] setting named as a SchedulerConfig field arrives with its value (a field left out of
    # ENGINE_FIELDS would keep the engine's default whatever the operator set)
    from dataclasses import fields

    from lookahead_core.engine.sched_config import SchedulerConfig

    # threads: 0 in the settings means every core, resolved on the way
    shared = {f.name for f in fields(SchedulerConfig)} & set(GeneratorSettings.model_fields) - {"threads"}
    settings = GeneratorSettings(usage_half_life_s=3.5, prefill_lead_s=0.25, max_running_per_tenant=5)
    config = scheduler_config(settings)
    assert {name: getattr(config, name) for name in shared} == {name: getattr(settings, name) for name in shared}
