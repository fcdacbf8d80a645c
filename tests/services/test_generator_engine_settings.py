"""Generator settings that shape the engine's steps reach its SchedulerConfig, and bad values are refused."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from lookahead_rag.services.generator.core import GeneratorCore
from lookahead_rag.services.generator.settings import GeneratorSettings


def test_the_prefill_tree_share_reaches_the_engine() -> None:
    assert GeneratorCore._scheduler_config(GeneratorSettings(prefill_tree_share=0.2)).prefill_tree_share == 0.2
    assert GeneratorSettings().prefill_tree_share == 0.05  # the default: trees add <= 5% while prompts prefill
    no_cap = GeneratorSettings(prefill_tree_share=math.inf)  # inf: trees are not capped while prompts prefill
    assert GeneratorCore._scheduler_config(no_cap).prefill_tree_share == math.inf


def test_a_negative_prefill_tree_share_is_refused() -> None:
    with pytest.raises(ValidationError, match="prefill_tree_share"):
        GeneratorSettings(prefill_tree_share=-1)
