"""Issue 46, finding 6: the prefill room was first come, first served, so one tenant's long prompts made every
other tenant's first token wait for all of them. Now a step's prefill room is shared by tenant."""

from __future__ import annotations

from lookahead_core.engine.plan import StepLimits, plan_step
from lookahead_core.engine.request import Phase

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
