"""FairQueue: bounded waiting, fair share by tenant, FIFO within a tenant, cancel and deadlines."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_core.engine.admission import FairQueue, QueueFull

from tests.core.peek import waiting_by_tenant

BURST = 50  # requests one tenant pushes at once
MAX_WAITING = 64  # queue bound in the tests that do not test the bound


@dataclass(eq=False)
class Req:
    """A request; distinct objects even with equal fields (the queue matches by identity)."""

    tenant: str
    n: int


def drain(q: FairQueue[Req], running: dict[str, int] | None = None, start: bool = False) -> list[Req]:
    """Pop until empty; with ``start``, each popped request counts as running for its tenant."""
    running = {} if running is None else running
    out: list[Req] = []
    while (req := q.pop(running)) is not None:
        out.append(req)
        if start:
            running[req.tenant] = running.get(req.tenant, 0) + 1
    return out


# ---- fair share ------------------------------------------------------------------------------------
@pytest.mark.parametrize("start", [False, True])
def test_burst_does_not_starve_a_single_request(start: bool) -> None:
    # tenant a floods the queue, then b asks once: b goes right after a's first request, whether
    # or not the popped requests are reported as running (round robin alone must be fair)
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    burst = [Req("a", i) for i in range(BURST)]
    for r in burst:
        q.push("a", r, None)
    single = Req("b", 0)
    q.push("b", single, None)
    order = drain(q, start=start)
    assert order[:3] == [burst[0], single, burst[1]]
    assert order[2:] == burst[1:]


def test_fewest_running_goes_first() -> None:
    # b has 3 running, a has 1: a's later request goes before b's earlier one
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    rb, ra = Req("b", 0), Req("a", 0)
    q.push("b", rb, None)
    q.push("a", ra, None)
    assert q.pop({"a": 1, "b": 3}) is ra
    assert q.pop({"a": 2, "b": 3}) is rb


def test_round_robin_between_equal_tenants() -> None:
    # three tenants with two requests each, nothing running: a, b, c, a, b, c
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    reqs = {t: [Req(t, i) for i in range(2)] for t in "abc"}
    for t in "abc":
        for r in reqs[t]:
            q.push(t, r, None)
    assert drain(q) == [reqs[t][i] for i in range(2) for t in "abc"]


def test_fifo_within_a_tenant() -> None:
    # one tenant's requests leave in push order, even interleaved with another tenant's
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    for i in range(5):
        q.push("a", Req("a", i), None)
        q.push("b", Req("b", i), None)
    order = drain(q)
    assert [r.n for r in order if r.tenant == "a"] == list(range(5))
    assert [r.n for r in order if r.tenant == "b"] == list(range(5))


def test_pop_on_empty_returns_none() -> None:
    # nothing waiting: None, not an error
    assert FairQueue[Req](MAX_WAITING).pop({}) is None


# ---- bound -----------------------------------------------------------------------------------------
def test_full_queue_raises_at_once() -> None:
    # the bound counts all tenants together; the rejected request is not queued; a pop frees a place
    q: FairQueue[Req] = FairQueue(3)
    for i, t in enumerate("aab"):
        q.push(t, Req(t, i), None)
    with pytest.raises(QueueFull):
        q.push("c", Req("c", 0), None)
    assert len(q) == 3 and waiting_by_tenant(q) == {"a": 2, "b": 1}
    q.pop({})
    q.push("c", Req("c", 1), None)
    assert waiting_by_tenant(q) == {"a": 1, "b": 1, "c": 1}


def test_negative_bound_is_refused() -> None:
    # a negative max_waiting is a configuration error
    with pytest.raises(ValueError, match="max_waiting"):
        FairQueue(-1)


# ---- cancel ----------------------------------------------------------------------------------------
def test_remove_waiting_request_frees_its_place() -> None:
    # a cancel takes the request out at once: the full queue accepts a new one, and it is never popped
    q: FairQueue[Req] = FairQueue(2)
    r0, r1 = Req("a", 0), Req("a", 1)
    q.push("a", r0, None)
    q.push("a", r1, None)
    assert q.remove(r0) is True
    q.push("b", Req("b", 0), None)
    assert r0 not in drain(q)


def test_remove_returns_false_for_unknown_or_popped() -> None:
    # never queued, already popped, already removed, or only an equal-looking twin: False
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    r = Req("a", 0)
    q.push("a", r, None)
    assert q.remove(Req("a", 0)) is False
    assert q.pop({}) is r
    assert q.remove(r) is False
    q.push("a", r, None)
    assert q.remove(r) is True
    assert q.remove(r) is False
    assert len(q) == 0


# ---- deadlines -------------------------------------------------------------------------------------
def test_expire_returns_exactly_the_expired() -> None:
    # deadlines 1..4 and None; at now=2.5 the ones at 1 and 2 expire (push order), the rest stay
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    reqs = [Req("ab"[i % 2], i) for i in range(5)]
    deadlines = [4.0, 2.0, None, 1.0, 3.0]
    for r, d in zip(reqs, deadlines, strict=True):
        q.push(r.tenant, r, d)
    assert q.expire(2.5) == [reqs[1], reqs[3]]
    assert q.expire(2.5) == []
    assert len(q) == 3
    assert sorted(r.n for r in drain(q)) == [0, 2, 4]


def test_expire_at_the_deadline_itself() -> None:
    # a deadline equal to now has passed
    q: FairQueue[Req] = FairQueue(MAX_WAITING)
    r = Req("a", 0)
    q.push("a", r, 5.0)
    assert q.expire(4.999) == []
    assert q.expire(5.0) == [r]


# ---- properties ------------------------------------------------------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from("abc"), st.one_of(st.none(), st.integers(0, 20))),
        st.tuples(st.just("pop"), st.dictionaries(st.sampled_from("abc"), st.integers(0, 3))),
        st.tuples(st.just("remove"), st.integers(0, 40)),
        st.tuples(st.just("expire"), st.integers(0, 20)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, bound=st.integers(0, 8))
def test_no_request_lost_or_duplicated(ops: list[tuple], bound: int) -> None:
    # any mix of push/pop/remove/expire against a plain list model: every accepted request comes
    # out exactly once, pops are FIFO per tenant, and len / waiting_by_tenant always match
    q: FairQueue[Req] = FairQueue(bound)
    made: list[Req] = []  # every request built, accepted or not
    deadline: dict[int, int | None] = {}  # id(request) -> its deadline
    accepted: list[Req] = []
    waiting: list[Req] = []  # the model: accepted and not yet out, in push order
    out: list[Req] = []  # everything that came out, by any door
    for op in ops:
        if op[0] == "push":
            req = Req(op[1], len(made))
            made.append(req)
            if len(waiting) >= bound:
                with pytest.raises(QueueFull):
                    q.push(op[1], req, op[2])
                continue
            q.push(op[1], req, op[2])
            deadline[id(req)] = op[2]
            accepted.append(req)
            waiting.append(req)
        elif op[0] == "pop":
            req = q.pop(op[1])
            assert (req is None) == (not waiting)
            if req is not None:
                assert req is next(w for w in waiting if w.tenant == req.tenant)  # oldest of its tenant
                waiting.remove(req)
                out.append(req)
        elif op[0] == "remove":
            target = made[op[1]] if op[1] < len(made) else Req("a", -1)
            was_waiting = any(w is target for w in waiting)
            assert q.remove(target) is was_waiting
            if was_waiting:
                waiting.remove(target)
                out.append(target)
        else:
            gone = q.expire(op[1])
            due = [w for w in waiting if (d := deadline[id(w)]) is not None and d <= op[1]]
            assert gone == due
            for req in gone:
                waiting.remove(req)
            out.extend(gone)
        assert len(q) == len(waiting)
        assert waiting_by_tenant(q) == dict(Counter(w.tenant for w in waiting))
    out.extend(drain(q))
    assert sorted(map(id, out)) == sorted(map(id, accepted))
