"""plan_step (engine/plan.py) on stand-in requests: prefill first, roots always, trees from what is left."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from lookahead_core.drafting.draft import DraftTree
from lookahead_core.engine.gains import GainsModel
from lookahead_core.engine.plan import StepLimits, plan_step
from lookahead_core.engine.request import Phase
from lookahead_core.engine.sched_config import SchedulerConfig

LIMITS = StepLimits(max_tokens=512, prefill_chunk=256, ttft_target_s=2.0)


def linear(n: int) -> float:
    """40 ms a forward plus 2.4 ms a token (a 2-core CPU's shape)."""
    return 0.040 + 0.0024 * n


@dataclass
class FakeTicket:
    phase: Phase
    submitted: float = field(default_factory=time.perf_counter)
    tenant: str = "t"


class FakeDrafting:
    def extra_tokens(self) -> int:
        return 0

    def extra(self, _parents: Any, _past: int) -> None:
        return None


IDS = itertools.count()


class Fake:
    """What plan_step reads of a running request; its trie offers a chain of ``offer`` nodes of ``prob``."""

    def __init__(self, phase: Phase, offer: int = 0, prob: float = 1.0, budget: int = 8, extend: int = 32,
                 prompt: int = 0, age_s: float = 0.0, tenant: str = "t") -> None:
        self.req = FakeTicket(phase, time.perf_counter() - age_s, tenant)
        self.offer, self.prob, self.budget, self.extend = offer, prob, budget, extend
        self.prompt_ids = list(range(prompt))
        self.prefilled = 0
        self.history: list[Any] = []
        self.drafting = FakeDrafting()
        self.asked: tuple[int, int] | None = None
        self.id, self.kv, self.emitted = f"fake-{next(IDS)}", SimpleNamespace(length=prompt), 0

    def root(self) -> int:
        return 0

    def context(self) -> list[int]:
        return self.prompt_ids

    def max_budget(self) -> int:
        return self.budget

    def max_extend(self) -> int:
        return self.extend

    def draft(self, budget: int, extend_to: int) -> DraftTree:
        self.asked = (budget, extend_to)
        tree = DraftTree()
        parent = 0
        for i in range(min(self.offer, max(budget, extend_to))):
            parent = tree.add(parent, 100 + i, prob=self.prob ** (i + 1))
        return tree


def plan(live: list[Fake], limits: StepLimits = LIMITS) -> Any:
    return plan_step(live, limits, GainsModel(), linear, time.perf_counter())  # type: ignore[arg-type]


def tokens(p: Any) -> int:
    """Tokens in the step's forward: roots, tree nodes and prefill chunks."""
    return sum(1 + len(d.tree) for d in p.decodes) + sum(c.end - c.first for c in p.chunks)


def test_a_prefill_chunk_does_not_make_trees_look_free() -> None:
    # the same two decodes with and without a just-arrived prompt (plenty of slack): the chunk's tokens
    # are due anyway, so the trees are priced as the decodes' own (they used to fill the forward)
    alone = plan([Fake(Phase.DECODE, 32, 0.8), Fake(Phase.DECODE, 32, 0.8)])
    beside = plan([Fake(Phase.DECODE, 32, 0.8), Fake(Phase.DECODE, 32, 0.8), Fake(Phase.PREFILL, prompt=300)])
    assert [d.budget for d in beside.decodes] == [d.budget for d in alone.decodes]
    assert beside.chunks and beside.chunks[0].end == 256


def test_a_late_prompt_gets_the_step_without_trees() -> None:
    # the prompt waited past its target: prefill and roots only, the decodes keep their one token
    p = plan([Fake(Phase.DECODE, 32, 1.0), Fake(Phase.DECODE, 32, 1.0), Fake(Phase.PREFILL, prompt=300, age_s=3.0)])
    assert [d.budget for d in p.decodes] == [0, 0]
    assert tokens(p) == 256 + 2


def test_a_tight_target_caps_the_forward() -> None:
    # 1.5 s of slack for a 300-token prompt: two steps of at most 0.75 s -> 295 tokens (ttft.py's example)
    decodes = [Fake(Phase.DECODE, 64, 1.0) for _ in range(15)]
    p = plan([*decodes, Fake(Phase.PREFILL, prompt=300, age_s=0.5)])
    assert tokens(p) <= 295
    assert sum(d.budget for d in p.decodes) > 0  # some room for trees is left


def test_while_a_prompt_prefills_trees_add_at_most_the_share() -> None:
    # plenty of TTFT slack, but a 5% share: a 256-token chunk and two roots cost linear(258) = 0.659 s, so
    # the step may last 0.692 s: at most 271 tokens, 13 of them for the two trees
    shared = StepLimits(max_tokens=512, prefill_chunk=256, ttft_target_s=2.0, prefill_tree_share=0.05)
    p = plan([Fake(Phase.DECODE, 32, 1.0), Fake(Phase.DECODE, 32, 1.0), Fake(Phase.PREFILL, prompt=300)], shared)
    assert 258 < tokens(p) <= 271
    alone = [Fake(Phase.DECODE, 32, 1.0), Fake(Phase.DECODE, 32, 1.0)]  # no prompt: the share does not apply
    assert tokens(plan(alone, shared)) == tokens(plan([Fake(Phase.DECODE, 32, 1.0), Fake(Phase.DECODE, 32, 1.0)]))


def test_nothing_waiting_trees_grow_back() -> None:
    # the same decodes with no prompt waiting: trees take more than under the tight target
    tight = plan([*(Fake(Phase.DECODE, 64, 1.0) for _ in range(15)), Fake(Phase.PREFILL, prompt=300, age_s=0.5)])
    free = plan([Fake(Phase.DECODE, 64, 1.0) for _ in range(15)])
    assert sum(d.budget for d in free.decodes) > sum(d.budget for d in tight.decodes)


def test_a_repeated_answer_verifies_as_one_long_chain() -> None:
    # one request whose past answer continues for 100 confident nodes: the whole chain in one step
    p = plan([Fake(Phase.DECODE, 100, 1.0, extend=120)])
    assert p.decodes[0].budget == 100


def test_each_request_keeps_its_base_budget_before_another_extends() -> None:
    # the first request could copy 600 nodes: it may take what the second's base budget leaves, no more
    first, second = Fake(Phase.DECODE, 600, 1.0, extend=600), Fake(Phase.DECODE, 8, 1.0)
    plan([first, second])
    assert second.asked is not None and second.asked[0] == 8
    assert first.asked is not None and first.asked[1] == 512 - 2 - 8


def test_only_a_copying_request_may_extend_past_max_decoding_length() -> None:
    # Active.max_extend on a stand-in: while every step verified its deepest branch whole (a repeated
    # answer), the rest of the answer; once a step stopped short, the config's max_decoding_length
    from types import SimpleNamespace

    from lookahead_core.config import DecodingConfig
    from lookahead_core.engine.active import Active

    req = SimpleNamespace(config=DecodingConfig(max_new_tokens=128), room=100, copying=True, max_budget=lambda: 8)
    assert Active.max_extend(req) == 100  # type: ignore[arg-type]
    req.copying = False
    assert Active.max_extend(req) == 32  # type: ignore[arg-type]
    req.max_budget = lambda: 0  # no room to draft at all
    assert Active.max_extend(req) == 0  # type: ignore[arg-type]


def test_the_share_comes_from_the_scheduler_config_and_cannot_be_negative() -> None:
    assert SchedulerConfig().prefill_tree_share == 0.05  # the engine's default: trees add <= 5% while prompts prefill
    with pytest.raises(ValueError, match="prefill_tree_share"):
        SchedulerConfig(prefill_tree_share=-0.1)
    assert SchedulerConfig(prefill_tree_share=math.inf).prefill_tree_share == math.inf  # inf: no cap


def test_fair_prefill_splits_the_room_by_tenant() -> None:
    from lookahead_core.engine.plan import fair_prefill

    # one tenant: its requests in order, as before
    assert fair_prefill([300, 300], ["a", "a"], 256) == [256, 0]
    # two tenants with long prompts: half each
    assert fair_prefill([300, 300], ["a", "b"], 256) == [128, 128]
    # b needs less than half: a takes what b leaves, in its own order
    assert fair_prefill([300, 300, 40], ["a", "a", "b"], 256) == [216, 0, 40]
    # everything fits: every need granted
    assert fair_prefill([10, 20, 30], ["a", "b", "a"], 256) == [10, 20, 30]
    # no room: nothing
    assert fair_prefill([10], ["a"], 0) == [0]


def test_fair_prefill_serves_the_least_recently_used_tenant_first() -> None:
    from lookahead_core.engine.plan import fair_prefill

    # a prefilled 5000 tokens lately, b nothing: b's prompt takes the whole room
    assert fair_prefill([300, 300], ["a", "b"], 256, {"a": 5000.0}) == [0, 256]
    # b needs 40 of it: a gets what is left
    assert fair_prefill([300, 40], ["a", "b"], 256, {"a": 5000.0}) == [216, 40]
    # equal usage: split evenly, as without usage
    assert fair_prefill([300, 300], ["a", "b"], 256, {"a": 7.0, "b": 7.0}) == [128, 128]
    # three tenants: the two unused ones split the room, the heavy one waits
    assert fair_prefill([300, 300, 300], ["a", "b", "c"], 256, {"a": 900.0}) == [0, 128, 128]
    # usage of tenants with nothing to prefill changes nothing
    assert fair_prefill([300], ["a"], 256, {"a": 900.0, "z": 1.0}) == [256]


def test_tenant_usage_decays_by_its_half_life_and_splits_a_forward_by_tokens() -> None:
    from lookahead_core.engine.usage import TenantUsage, decayed, split_by_tokens

    assert decayed(100.0, 10.0, 10.0) == 50.0  # one half-life: half
    assert decayed(100.0, 30.0, 10.0) == 12.5  # three: an eighth
    assert decayed(100.0, -1.0, 10.0) == 100.0  # a clock that went back: unchanged
    # a forward's seconds by each tenant's tokens in it (a tenant twice: summed)
    assert split_by_tokens([("a", 300), ("b", 50), ("b", 50)], 0.8) == pytest.approx({"a": 0.6, "b": 0.2})
    assert split_by_tokens([], 1.0) == {}  # no tokens: nobody charged
    usage = TenantUsage(half_life_s=10.0)
    usage.charge([("a", 3), ("b", 1)], 2.0, now=100.0)
    assert usage.at(100.0) == {"a": 1.5, "b": 0.5}
    assert usage.at(110.0) == {"a": 0.75, "b": 0.25}  # ten seconds later: halved
    assert usage.at(1000.0) == {}  # long idle: forgotten, as a new tenant
    with pytest.raises(ValueError, match="half_life_s"):
        TenantUsage(half_life_s=0.0)


def test_a_tenant_far_ahead_of_a_decoding_one_waits_with_its_prompt() -> None:
    from lookahead_core.engine.plan import outweighed, prefill_chunks

    hog = Fake(Phase.PREFILL, prompt=4000, tenant="hog")
    decoding = Fake(Phase.DECODE, tenant="b")
    limits = StepLimits(max_tokens=512, prefill_chunk=256, prefill_lead_s=2.0)
    # the hog used 9 s lately, b 1 s and b is decoding: the hog's prompt waits, b's steps stay short
    assert outweighed([hog, decoding], {"hog": 9.0, "b": 1.0}, 2.0) == {"hog"}
    assert prefill_chunks([hog, decoding], limits, 1, {"hog": 9.0, "b": 1.0}) == []
    # within the lead (2.5 s): it prefills beside b
    assert [c.end for c in prefill_chunks([hog, decoding], limits, 1, {"hog": 2.5, "b": 1.0})] == [256]
    # nobody else decoding: it never waits, however much it used
    assert outweighed([hog], {"hog": 99.0}, 2.0) == set()
    # its own requests decoding do not hold it back
    assert outweighed([hog, Fake(Phase.DECODE, tenant="hog")], {"hog": 99.0}, 2.0) == set()
    # a light tenant's prompt beside a heavy tenant's decode: never held
    light = Fake(Phase.PREFILL, prompt=300, tenant="b")
    assert outweighed([light, Fake(Phase.DECODE, tenant="hog")], {"hog": 9.0, "b": 1.0}, 2.0) == set()
