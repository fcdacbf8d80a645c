"""Fixtures of the decoding-core tests (plain helpers live in helpers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.models import load_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tests.core.helpers import StubTokenizer

NO_CALIBRATION = SchedulerConfig(calibrate=False)  # schedulers of the tests skip start-up measurement


def _intra_op(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    yield  # pytest resumes a fixture after its test whatever the outcome
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run several times faster on one intra-op thread (no OpenMP hand-offs on a busy box).

    List it in a module's ``pytestmark = pytest.mark.usefixtures("one_thread")`` (or on one test).
    """
    yield from _intra_op(1)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two intra-op threads (the split kernel is offered with 2+: one row block per thread)."""
    yield from _intra_op(2)


@pytest.fixture
def scheduler_of() -> Iterator:
    """``make(model, config=calibration off, **kw)``: started StepSchedulers, closed after the test."""
    made: list[StepScheduler] = []

    def make(model: PreTrainedModel, config: SchedulerConfig = NO_CALIBRATION, **kw: object) -> StepScheduler:
        sched = StepScheduler(model, StubTokenizer(), config, **kw).start()  # type: ignore[arg-type]
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.close()


@pytest.fixture(scope="module")
def smollm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The served model (SmolLM2-135M-Instruct) and its tokenizer, offline, once per module."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_model()
