"""The observer the side-channel-safe stream must defeat (tests/pipeline/observer.py says how it works).

With the mode off it must beat chance clearly; with it on it must be no better than chance: accuracy
at most 0.5 + 3 * sqrt(0.25 / trials), three standard deviations of a fair coin.
``test_observer_small`` (24 trials per mode, ~3 min on 2 cores) always runs; the 200-trial one is opt-in.
"""

from __future__ import annotations

import os

import pytest

from tests.pipeline.helpers import RunningPipeline, module_loop, module_pipeline
from tests.pipeline.observer import (
    CHUNK,
    WHOLE_HISTORY,
    chance_bound,
    check_observer,
    cross_validated_accuracy,
    questions,
    run_observer,
)

observed = module_pipeline(generator={"safe_stream_chunk_tokens": CHUNK}, limits={"default_m": 0},
                           draftcache=WHOLE_HISTORY)

SMALL_TRIALS = 24  # the always-run version: its chance bound is 0.806
LONG_TRIALS = 200  # the figure for docs/SECURITY.md: chance bound 0.606
LONG_OBSERVER_ENV = "LAR_TEST_OBSERVER_200"  # set to 1 to run the 200-trial observer (~25 min on 2 cores)


@module_loop
async def test_observer_small(observed: RunningPipeline) -> None:
    check_observer(await run_observer(observed, SMALL_TRIALS))


@module_loop
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(LONG_OBSERVER_ENV) != "1", reason=f"opt-in: {LONG_OBSERVER_ENV}=1 (~25 min)")
@pytest.mark.timeout(5400)  # one tick (1.5 x a slow fresh answer) per safe trial
async def test_observer_200_trials(observed: RunningPipeline) -> None:
    # 100 hits and 100 misses per mode
    check_observer(await run_observer(observed, LONG_TRIALS))


def test_chance_bound_is_three_sigma() -> None:
    assert chance_bound(200) == pytest.approx(0.606, abs=1e-3)


def test_questions_have_distinct_subjects_and_cover_200_trials() -> None:
    asked = questions(LONG_TRIALS)
    assert len(set(asked)) == LONG_TRIALS
    assert questions(SMALL_TRIALS) == questions(SMALL_TRIALS)  # seeded: every run asks the same
    assert questions(SMALL_TRIALS) != questions(SMALL_TRIALS, seed=1)


def test_fit_finds_a_separating_threshold_and_cv_scores_it() -> None:
    # hits: few, large messages; misses: many small ones (the normal stream's signal)
    hits = [[(300, 0.1)] * 2 for _ in range(10)]
    misses = [[(60, 0.05)] * 8 for _ in range(10)]
    traces = [t for h, m in zip(hits[::2], misses[::2], strict=True) for t in (h, h, m, m)]  # both folds get both
    labels = [(i // 2) % 2 == 0 for i in range(len(traces))]
    accuracy, _ = cross_validated_accuracy(traces, labels)
    assert accuracy == 1.0
    same = [[(200, 0.15)] * 3 for _ in range(20)]  # identical traces: no rule can beat chance
    assert cross_validated_accuracy(same, labels)[0] == 0.5
