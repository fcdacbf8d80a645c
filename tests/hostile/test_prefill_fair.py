"""Issue 46, finding 6: the prefill room was first come, first served, so one tenant's long prompts made every
other tenant's first token wait for all of them. Now a step's prefill room is shared by tenant, the tenant that
used least of it lately first (a light tenant beside a heavy one prefills as fast as alone)."""

from __future__ import annotations

import random

from lookahead_core.config import DecodingConfig
from lookahead_core.engine.plan import StepLimits, plan_step
from lookahead_core.engine.request import Phase, ServeRequest
from lookahead_core.engine.scheduler import SchedulerConfig, StepScheduler

from tests.core.helpers import StubTokenizer, tiny_model
from tests.core.test_core_plan import Fake


def test_a_later_tenants_prompt_prefills_beside_a_heavy_tenants() -> None:
    # tenant a admitted three 8k-token prompts first, tenant b one 300-token prompt after them: b's prompt gets
    # half of the first step's 256-token room, not nothing until a's 24k tokens are in
    heavy = [Fake(Phase.PREFILL, prompt=8192, tenant="a") for _ in range(3)]
    light = Fake(Phase.PREFILL, prompt=300, tenant="b")
    plan = plan_step([*heavy, light], StepLimits(max_tokens=512, prefill_chunk=256), None, None)
    by_id = {c.id: c.end - c.first for c in plan.chunks}
    assert by_id[light.id] == 128
    assert sum(by_id.values()) == 256


def steps_to_first_token(hogs: int) -> int:
    """Steps until a 300-token prompt of tenant b has its first token, submitted once ``hogs`` 512-token
    prompts of tenant a have prefilled for 4 steps (64-token prefill room a step)."""
    config = SchedulerConfig(calibrate=False, max_running=16, prefill_chunk=64, max_tokens_per_forward=128)
    sched = StepScheduler(tiny_model("llama"), StubTokenizer(), config).start(thread=False)  # type: ignore[arg-type]
    rng = random.Random(0)
    for _ in range(hogs):
        sched.submit(ServeRequest([rng.randrange(3, 200) for _ in range(512)], DecodingConfig(max_new_tokens=4),
                                  tenant="a"))
    for _ in range(4 if hogs else 0):
        sched.step()
    light = ServeRequest([rng.randrange(3, 200) for _ in range(300)], DecodingConfig(max_new_tokens=4), tenant="b")
    sched.submit(light)
    steps = 0
    while not light.output and sched.step():
        steps += 1
    sched.close()
    return steps


def test_a_light_tenant_beside_a_heavy_one_prefills_about_as_fast_as_alone() -> None:
    # b's 300 tokens take 5 steps alone; arriving while a's four 512-token prompts prefill, b has used less of
    # the room lately, so it takes all of it: at most one step more, not twice as many (an even split: 10)
    alone = steps_to_first_token(0)
    assert steps_to_first_token(4) <= alone + 1


def test_a_heavy_tenants_prompt_stays_out_of_most_of_a_light_tenants_decode_steps() -> None:
    # tenant a keeps four 512-token prompts prefilling; b's short prompt arrives, then b decodes 24 tokens. With
    # no lead allowed (prefill_lead_s 0), a's chunks ride only in the steps that let a's engine time catch up with
    # b's: most of b's decode steps are b's alone (before: every one carried a 64-token chunk of a's)
    config = SchedulerConfig(calibrate=False, max_running=16, prefill_chunk=64, max_tokens_per_forward=128,
                             prefill_lead_s=0.0)
    sizes: list[int] = []
    sched = StepScheduler(tiny_model("llama"), StubTokenizer(), config,  # type: ignore[arg-type]
                          on_forward=lambda tokens, _batch: sizes.append(tokens)).start(thread=False)
    rng = random.Random(1)
    heavy = [ServeRequest([rng.randrange(3, 200) for _ in range(512)], DecodingConfig(max_new_tokens=4), tenant="a")
             for _ in range(4)]
    for req in heavy:
        sched.submit(req)
    for _ in range(4):
        sched.step()
    light = ServeRequest([rng.randrange(3, 200) for _ in range(40)], DecodingConfig(max_new_tokens=24), tenant="b")
    sched.submit(light)
    while not light.output:
        sched.step()
    decoding_from = len(sizes)
    while light.phase is not Phase.DONE:
        sched.step()
    with_chunks = [n for n in sizes[decoding_from:] if n > config.prefill_chunk // 2]
    assert len(with_chunks) <= len(sizes[decoding_from:]) // 2
    while sched.step():
        pass
    sched.close()
    assert all(r.error is None and r.phase is Phase.DONE for r in [*heavy, light])  # a's prompts still finish
