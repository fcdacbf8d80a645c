"""The device benchmark's parts that run here: its ways on a tiny model agree with each other, and its pure
helpers (distinct prompts, equality counts) say what they should."""

from __future__ import annotations

import random

import pytest
from lookahead_core import DecodingConfig
from lookahead_core.engine.sched_config import SchedulerConfig

from lookahead_rag.bench.device import distinct
from lookahead_rag.bench.device_runs import Outputs, engine, equal, hf_generate, serve
from tests.core.helpers import StubTokenizer, eos_as, random_prompt, tiny_model


def test_distinct_keeps_the_first_of_each_prompt_in_order() -> None:
    # a repeated prompt counts once; at most n
    assert distinct([[1], [2], [1], [3], [4]], 3) == [[1], [2], [3]]


def test_equal_counts_and_says_where_outputs_part() -> None:
    # two of three equal; the third parts at token 1; a shorter output parts where it ends
    refs = Outputs([[1, 2, 3], [4, 5], [6, 7]])
    assert equal(Outputs([[1, 2, 3], [4, 9], [6, 7]]), refs) == {"equal": 2, "of": 3, "first_differences": [1]}
    assert equal(Outputs([[1, 2], [4, 5], [6, 7]]), refs)["first_differences"] == [2]


@pytest.mark.parametrize("backend", ["cpu", "generic"])
def test_each_engine_way_equals_hf_generate(backend: str) -> None:
    # one stream and all at once, one token a step and speculating: the engine's outputs are HF generate's
    model = tiny_model("llama")
    prompts = [random_prompt(random.Random(60 + i)) for i in range(3)]
    with eos_as(model, None):
        refs = hf_generate(model, prompts, 12, lookup=False)
        sched = engine(model, StubTokenizer(), SchedulerConfig(calibrate=False, backend=backend,  # type: ignore[arg-type]
                                                               kv_slot_tokens=128))
        try:
            for mode in ("none", "hierarchical"):
                for at_once in (False, True):
                    out = serve(sched, prompts, DecodingConfig(mode=mode, max_new_tokens=12), at_once)
                    assert equal(out, refs)["equal"] == 3 and out.steps > 0
        finally:
            sched.close()
