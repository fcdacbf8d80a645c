"""Issue 46, finding 3: request KV had no byte budget, so one tenant's long requests could hold every running
place and all the memory. Now admission counts each request's KV (prompt + max_new_tokens + a step) against the
engine's budget and the tenant's share, and caps a tenant's running requests: what cannot fit now waits (other
tenants pass it), what could never fit is refused at once."""

from __future__ import annotations

import random

import pytest
from lookahead_core.config import DecodingConfig
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler
from lookahead_core.serving import KVTooLong

from tests.core.helpers import StubTokenizer, random_prompt, tiny_model


def engine(**cfg: object) -> StepScheduler:
    config = SchedulerConfig(**{"calibrate": False, "max_running": 4, **cfg})  # type: ignore[arg-type]
    return StepScheduler(tiny_model("llama"), StubTokenizer(), config).start(thread=False)  # type: ignore[arg-type]


def ask(tenant: str, max_new: int = 16) -> ServeRequest:
    return ServeRequest(random_prompt(random.Random(5)), DecodingConfig(max_new_tokens=max_new), tenant=tenant)


def running(sched: StepScheduler) -> list[str]:
    return sorted(a.req.tenant for a in sched.running)


def test_a_request_past_the_tenant_share_is_refused_at_once() -> None:
    # a tenant's share of a 1 MiB budget is 0.5 MiB; a request needing more can never run: refused, one line
    sched = engine(kv_budget_bytes=1 << 20)
    need_per_token = sched.backend.kv_bytes(1)  # the CPU backend's figure: capacity x bytes per entry
    with pytest.raises(KVTooLong, match="tenant's running requests may hold"):
        sched.submit(ask("a", max_new=(1 << 19) // need_per_token + 1))
    sched.close()


def test_a_heavy_tenant_leaves_room_for_another() -> None:
    # tenant a sends four requests whose KV fills its share twice over, then b sends one: the first step admits
    # two of a's and b's; a's others wait for a's own to finish
    sched = engine()
    each = sched._kv_need(ask("a"))
    sched.close()
    sched = engine(kv_budget_bytes=4 * each, kv_tenant_share=0.5)
    for _ in range(4):
        sched.submit(ask("a"))
    sched.submit(ask("b"))
    sched.step()
    assert running(sched) == ["a", "a", "b"]
    assert len(sched.queue) == 2
    while sched.step():
        pass
    sched.close()


def test_one_tenant_cannot_take_every_running_place() -> None:
    # max_running 4, places not lent: one tenant may hold 3, so a request of another tenant arriving later starts
    # at once
    sched = engine(lend_places=False)
    reqs = [ask("a", max_new=64) for _ in range(4)]
    for r in reqs:
        sched.submit(r)
    sched.step()
    assert running(sched) == ["a", "a", "a"]
    late = ask("b")
    sched.submit(late)
    sched.step()
    assert late.phase is not Phase.WAITING and "b" in running(sched)
    while sched.step():
        pass
    assert all(r.error is None for r in [*reqs, late])
    sched.close()


def test_a_place_lent_to_a_tenant_alone_is_given_back_when_another_arrives() -> None:
    # places lent (the default): tenant a alone fills all 4; b's request arriving later still starts at the next
    # step, one of a's requests paused (kept, not stepped) until a is back under its share of 3
    sched = engine()
    reqs = [ask("a", max_new=64) for _ in range(4)]
    for r in reqs:
        sched.submit(r)
    sched.step()
    assert running(sched) == ["a", "a", "a", "a"]
    late = ask("b")
    sched.submit(late)
    sched.step()
    assert late.phase is not Phase.WAITING
    stepped = sorted(a.req.tenant for a in sched.running if not a.paused)
    assert stepped == ["a", "a", "a", "b"] and sum(a.paused for a in sched.running) == 1
    while sched.step():
        assert sum(not a.paused for a in sched.running) <= 4  # never more stepped than places
    assert all(r.error is None and r.phase is Phase.DONE for r in [*reqs, late])
    sched.close()


def held_bytes(sched: StepScheduler) -> dict[str, int]:
    """Bytes of KV tensors each tenant's running requests hold (measured on the tensors, not the estimate)."""
    out: dict[str, int] = {}
    for active in sched.running:
        kv = active.kv
        out[active.req.tenant] = out.get(active.req.tenant, 0) + sum(
            t.numel() * t.element_size() for t in (*kv.keys, *kv.values))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_no_mix_of_requests_holds_more_kv_than_the_budget(seed: int) -> None:
    # three tenants send 16 requests of random prompt and answer lengths at once, some too long for a tenant's
    # share: after every step the KV tensors the running requests hold stay within the engine's budget and each
    # tenant's share; every request either finished without error or was refused at submit, none is lost
    rng = random.Random(seed)
    probe = engine()
    budget = 6 * probe._kv_need(ask("a", max_new=32))  # room for about six middling requests
    probe.close()
    sched = engine(max_running=8, kv_budget_bytes=budget, kv_tenant_share=0.5)
    accepted, refused = [], 0
    for i in range(16):
        req = ServeRequest(random_prompt(rng), DecodingConfig(max_new_tokens=rng.choice([4, 32, 96, 400])),
                           tenant="abc"[i % 3])
        try:
            sched.submit(req)
            accepted.append(req)
        except KVTooLong:
            refused += 1
    while True:
        more = sched.step()
        held = held_bytes(sched)
        assert sum(held.values()) <= budget
        assert all(b <= sched.config.tenant_kv_bytes for b in held.values())
        if not more:
            break
    sched.close()
    assert refused > 0 and len(accepted) + refused == 16  # the mix tried to exceed it
    assert all(r.phase is Phase.DONE and r.error is None for r in accepted)
