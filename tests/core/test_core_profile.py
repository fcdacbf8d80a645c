"""The engine's step profile: where a step's time goes, by phase, without changing a token."""

from __future__ import annotations

import random
import time
from unittest.mock import patch

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.profile import PHASES, StepProfile
from lookahead_core.engine.scheduler import SchedulerConfig

from tests.core.helpers import eos_as, greedy, random_prompt, serve_all_greedy, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_steps_are_booked_by_kind_with_other_and_between() -> None:
    # a prefill step (0.1 s long, 40 ms forward of which 10 ms attention) leaves requests running; the
    # decode step after it starts 5 ms later (between) and takes 20 ms of which 12 in layers; the next
    # step after an idle engine (nothing was running) books no gap
    prof = StepProfile()
    prof.forward(0.040, attention=0.010)
    prof.step(started=time.perf_counter() - 0.1, prefill=True, tokens=300, emitted=1, running=True)
    prof._last_end = 10.0  # the prefill step ended at t = 10.0 s (perf_counter), as far as the next one sees
    prof.forward(0.012, attention=0.0)
    with patch.object(time, "perf_counter", return_value=10.025):
        prof.step(started=10.005, prefill=False, tokens=9, emitted=3, running=False)
        prof.step(started=10.025, prefill=False, tokens=1, emitted=1, running=False)
    got = prof.report()
    prefill, decode = got["prefill"], got["decode"]
    assert prefill["steps"] == 1 and prefill["tokens_per_forward"] == 300 and prefill["emitted_per_step"] == 1
    assert prefill["ms_per_step"]["layers"] == pytest.approx(30.0) and prefill["ms_per_step"]["attention"] == 10.0
    assert prefill["ms_per_step"]["other"] == pytest.approx(60.0, abs=1.0)  # 100 ms busy - 40 in phases
    assert decode["steps"] == 2 and decode["tokens_per_forward"] == 5 and decode["emitted_per_step"] == 2
    assert decode["ms_per_step"]["between"] == pytest.approx(2.5)  # 5 ms before the first, none before the second
    assert decode["ms_per_step"]["layers"] == pytest.approx(6.0)  # 12 ms over 2 steps
    assert decode["ms_per_step"]["other"] == pytest.approx(4.0)  # 20 ms busy - 12 ms in phases, over 2 steps
    assert list(decode["ms_per_step"]) == [*PHASES, "other", "between"]


def test_a_profiled_engine_times_every_phase_and_keeps_its_tokens(scheduler_of) -> None:
    model = tiny_model("llama")
    sched = scheduler_of(model, SchedulerConfig(calibrate=False, max_running=2))
    prof = sched.start_profile()
    rng = random.Random(11)
    prompts = [random_prompt(rng) for _ in range(2)]
    configs = [DecodingConfig(max_new_tokens=12, decoding_length=4), DecodingConfig(mode="none", max_new_tokens=9)]
    with eos_as(model, None):
        reqs = serve_all_greedy(sched, model, prompts, configs)  # each still equals plain greedy
    kinds = prof.kinds.values()
    assert sum(k.steps for k in kinds) == sched.forwards  # every step was profiled
    assert sum(k.emitted for k in kinds) == sum(len(r.output) for r in reqs) == 12 + 9
    assert sum(k.tokens for k in kinds) == sum(sched.forward_sizes.elements())
    assert prof.kinds["prefill"].steps >= 1 and prof.kinds["decode"].steps >= 1
    for phase in PHASES:
        assert prof.kinds["decode"].seconds[phase] > 0, phase  # each phase really ran and was timed
    assert all(v >= 0 for rep in prof.report().values() for v in rep["ms_per_step"].values())
    # unprofiled engines pay nothing and book nothing: a second engine on the same (hooked) twins
    other = scheduler_of(model, SchedulerConfig(calibrate=False))
    with eos_as(model, None):
        before = {name: dict(k.seconds) for name, k in prof.kinds.items()}
        serve_all_greedy(other, model, prompts[:1], configs[:1])
    assert other.profile is None and {name: k.seconds for name, k in prof.kinds.items()} == before
    assert reqs[0].output == greedy(model, prompts[0], 12)
