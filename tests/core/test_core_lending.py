"""Places lent to a tenant alone (engine/lending.py): the pure rules on hand-made counts, then the engine pausing a
borrower's request for another tenant's arrival without changing a token of it."""

from __future__ import annotations

import random
from collections import Counter

from lookahead_core.config import DecodingConfig
from lookahead_core.engine.admission import FairQueue
from lookahead_core.engine.lending import admission_round, alone, borrower, may_hold
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler

from tests.core.helpers import StubTokenizer, greedy, random_prompt, tiny_model

CFG = SchedulerConfig(max_running=4, calibrate=False)  # a tenant's share: 3 of 4 places
STRICT = SchedulerConfig(max_running=4, calibrate=False, lend_places=False)


def test_alone_counts_every_other_tenant_stepped_paused_or_waiting() -> None:
    # only a's own requests anywhere: alone
    assert alone("a", {"a": 3}, {}, {"a"})
    # b waits, is paused, or runs: not alone
    assert not alone("a", {"a": 3}, {}, {"a", "b"})
    assert not alone("a", {"a": 3}, {"b": 1}, set())
    assert not alone("a", {"a": 3, "b": 1}, {}, set())
    # a tenant counted with zero requests is not there
    assert alone("a", {"a": 3, "b": 0}, {"b": 0}, set())


def test_may_hold_lends_the_kept_places_only_to_a_tenant_alone() -> None:
    # under its share: a free place is a's
    assert may_hold("a", {"a": 2}, {}, set(), CFG)
    # at its share, alone: the fourth place is lent; not with lending off
    assert may_hold("a", {"a": 3}, {}, set(), CFG)
    assert not may_hold("a", {"a": 3}, {}, set(), STRICT)
    # at its share while b waits: kept for b, which may take it
    assert not may_hold("a", {"a": 3}, {}, {"b"}, CFG)
    assert may_hold("b", {"a": 3}, {}, {"b"}, CFG)
    # every place taken: no one may
    assert not may_hold("b", {"a": 4}, {}, {"b"}, CFG)


def test_borrower_is_the_tenant_most_over_its_share() -> None:
    # a holds one past its share of 3: it gives one back to b
    assert borrower({"a": 4, "b": 0}, CFG, "b") == "a"
    # no one past its share: no borrower
    assert borrower({"a": 3, "b": 1}, CFG, "b") is None
    # the asker itself is never its own borrower
    assert borrower({"a": 4}, CFG, "a") is None


class Fake:
    """An Active as admission_round reads it: a request's tenant and whether it is paused."""

    def __init__(self, tenant: str, paused: bool = False) -> None:
        self.req = ServeRequest([1, 2, 3], DecodingConfig(max_new_tokens=4), tenant=tenant)
        self.paused = paused


def queued(*tenants: str) -> tuple[FairQueue[ServeRequest], list[ServeRequest]]:
    queue: FairQueue[ServeRequest] = FairQueue(16)
    reqs = [ServeRequest([1, 2, 3], DecodingConfig(max_new_tokens=4), tenant=t) for t in tenants]
    for r in reqs:
        queue.push(r.tenant, r)
    return queue, reqs


def one_byte(_req: ServeRequest) -> int:
    return 1


def test_round_pauses_the_borrowers_newest_for_a_waiting_tenant() -> None:
    # a holds all 4 places; b's request waits: a's newest is paused and b's starts
    running = [Fake("a") for _ in range(4)]
    queue, (b,) = queued("b")
    plan = admission_round(running, queue, Counter(), one_byte, CFG)  # type: ignore[arg-type]
    assert plan.admit == [b] and plan.pause == [running[3]] and plan.resume == []


def test_round_resumes_a_paused_request_before_its_tenants_newer_ones() -> None:
    # a has 2 stepped and 1 paused, a second request of a waits, a place is free for each: the paused one first
    running = [Fake("a"), Fake("a"), Fake("a", paused=True)]
    queue, (newer,) = queued("a")
    plan = admission_round(running, queue, Counter(), one_byte, CFG)  # type: ignore[arg-type]
    assert plan.resume == [running[2]] and plan.admit == [newer] and plan.pause == []


def test_round_keeps_a_paused_borrower_paused_while_the_other_tenant_runs() -> None:
    # a: 3 stepped (its share) + 1 paused, b runs one: a's paused request stays paused, nothing starts
    running = [Fake("a"), Fake("a"), Fake("a"), Fake("a", paused=True), Fake("b")]
    queue, _ = queued()
    plan = admission_round(running, queue, Counter(), one_byte, CFG)  # type: ignore[arg-type]
    assert plan.resume == [] and plan.admit == [] and plan.pause == []


def test_round_with_lending_off_leaves_the_fourth_place_empty() -> None:
    # a alone with 4 waiting, strict shares: 3 start, one waits
    queue, reqs = queued("a", "a", "a", "a")
    plan = admission_round([], queue, Counter(), one_byte, STRICT)
    assert plan.admit == reqs[:3] and len(queue) == 1


def test_a_paused_and_resumed_request_answers_what_it_answers_alone() -> None:
    # tenant a fills all 4 places, b arrives after two steps and one of a's is paused until b ends: every answer,
    # the paused one's included, is its own greedy decoding
    model = tiny_model("llama")
    sched = StepScheduler(model, StubTokenizer(), SchedulerConfig(max_running=4, calibrate=False))  # type: ignore[arg-type]
    sched.start(thread=False)
    rng = random.Random(11)
    prompts = [random_prompt(rng) for _ in range(5)]
    reqs = [ServeRequest(p, DecodingConfig(max_new_tokens=20), tenant="a") for p in prompts[:4]]
    for r in reqs:
        sched.submit(r)
    sched.step()
    sched.step()
    late = ServeRequest(prompts[4], DecodingConfig(max_new_tokens=20), tenant="b")
    sched.submit(late)
    was_paused = set()
    while sched.step():
        was_paused |= {a.req.id for a in sched.running if a.paused}
    sched.close()
    assert was_paused  # the case under test happened
    for r, p in zip([*reqs, late], prompts, strict=True):
        assert r.phase is Phase.DONE and r.error is None
        assert r.output == greedy(model, p, 20)
