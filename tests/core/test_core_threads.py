"""Which threads run torch's parallel work (``lookahead_core.threads``): the engine's, and no other."""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Iterator

import pytest
import torch
from lookahead_core import DecodingConfig
from lookahead_core.engine.request import ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.threads import (
    claim_threads,
    new_thread_default,
    on_own_thread,
    serve_single_threaded,
    start_compute_thread,
)

from tests.core.helpers import StubTokenizer, eos_as, greedy, random_prompt, tiny_model


@pytest.fixture
def restore_threads() -> Iterator[None]:
    """Put back this thread's count and the default of new threads (both are process state)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)  # this thread's count and the default of threads started later


def test_claim_threads_changes_this_thread_only(restore_threads: None) -> None:
    serve_single_threaded()
    assert torch.get_num_threads() == 1 and new_thread_default() == 1
    seen: list[int] = []

    def engine() -> None:
        claim_threads(2)
        seen.append(torch.get_num_threads())

    worker = threading.Thread(target=engine)
    worker.start()
    worker.join()
    assert seen == [2]  # the claiming thread runs on 2
    assert new_thread_default() == 1  # a thread started later still gets 1 (no second OpenMP pool)
    assert torch.get_num_threads() == 1  # and so does the thread that served


def test_on_own_thread_returns_or_raises_on_the_callers_thread(restore_threads: None) -> None:
    serve_single_threaded()
    got = on_own_thread(lambda: (threading.current_thread().name, torch.get_num_threads()), 2, name="baseline")
    assert got == ("baseline", 2)
    assert new_thread_default() == 1  # the baseline's count did not leak into the default

    def boom() -> None:
        raise KeyError("bad prompt")

    with pytest.raises(KeyError, match="bad prompt"):
        on_own_thread(boom, 2)


def test_compute_thread_sets_up_before_start_returns_and_reports_a_failed_setup() -> None:
    events: list[str] = []
    done = threading.Event()
    thread = start_compute_thread(lambda: events.append("setup"), lambda: (events.append("loop"), done.set()), 1,
                                  "compute")
    assert events[0] == "setup"  # start returned after setup
    assert done.wait(5) and events == ["setup", "loop"]
    thread.join(5)

    def fail() -> None:
        raise RuntimeError("calibration failed")

    with pytest.raises(RuntimeError, match="calibration failed"):
        start_compute_thread(fail, lambda: events.append("never"), 1, "compute")
    assert "never" not in events  # a failed setup never loops


def test_engine_thread_calibrates_and_steps_with_its_own_threads(restore_threads: None) -> None:
    serve_single_threaded()  # as a serving process does: every thread but the engine's runs on one
    model = copy.deepcopy(tiny_model("llama"))  # its own kernel set: this engine calibrates it
    seen: set[tuple[str, int]] = set()  # (thread name, intra-op threads) of every forward of the engine's twins
    prompt = random_prompt(random.Random(11))
    config = SchedulerConfig(max_running=2, calibration_counts=(1, 4), calibration_repeats=1, calibration_past=8,
                             threads=2)
    with eos_as(model, None):
        want = greedy(model, prompt, 6)
        engine = StepScheduler(model, StubTokenizer(), config)
        hooks = [twin.register_forward_pre_hook(lambda *_: seen.add((threading.current_thread().name,
                                                                      torch.get_num_threads())))
                 for twin in engine.backend.modules()]
        try:
            engine.start()
            assert seen == {("step-scheduler", 2)}  # calibration ran on the engine's thread, on its threads
            try:
                done = threading.Event()
                req = ServeRequest(prompt, DecodingConfig(max_new_tokens=6), on_done=lambda _r, _e: done.set())
                engine.submit(req)
                assert done.wait(60) and req.output == want
            finally:
                engine.close()
        finally:
            for hook in hooks:
                hook.remove()
    assert seen == {("step-scheduler", 2)}  # and so did every step


def test_call_runs_on_the_engine_thread_and_returns_or_raises() -> None:
    config = SchedulerConfig(max_running=1, calibrate=False, threads=1)
    engine = StepScheduler(tiny_model("llama"), StubTokenizer(), config).start()
    try:
        # a baseline handed to the engine runs on its thread (its one OpenMP pool), between steps
        assert engine.call(lambda: threading.current_thread().name) == "step-scheduler"

        def boom() -> None:
            raise ValueError("baseline failed")

        with pytest.raises(ValueError, match="baseline failed"):
            engine.call(boom)
        assert engine.call(lambda: 7) == 7  # the engine goes on after a failed call
    finally:
        engine.close()
    # an engine driven by its callers (no thread of its own) runs it on the caller's thread
    driven = StepScheduler(tiny_model("llama"), StubTokenizer(), config).start(thread=False)
    assert driven.call(lambda: threading.current_thread().name) == threading.current_thread().name
