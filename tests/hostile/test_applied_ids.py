"""Issue 32 item 10: the retriever's applied-answer ids are kept per tenant, as the draft cache's and the
forget ledgers' are. A tenant that floods answers (raw Generate calls are cheap, each one an event)
pushes out only its own ids: another tenant's answer delivered again is still a duplicate, also after a
restore from a snapshot, and one saved when the ids were one global list still loads."""

from __future__ import annotations

from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.services.retriever.settings import RetrieverSettings
from lookahead_rag.v1 import events_pb2
from tests.services.test_forget import LATER_MS, HashEncoder, answer

CAPACITY, MAX_IDS = 100, 50  # past sessions per tenant, applied answer ids in all


def victims_answer() -> events_pb2.GenerationCompleted:
    return answer("victim", [1, 2, 3], [], started_ms=LATER_MS, question="q victim", text="victim's answer")


def flood(count: int) -> list[events_pb2.GenerationCompleted]:
    """``count`` answers of the flooding tenant with no question (a raw Generate's): recorded, never indexed."""
    return [events_pb2.GenerationCompleted(event_id=f"evil-{i}", tenant="evil") for i in range(count)]


def test_a_flood_of_answers_leaves_another_tenants_ids() -> None:
    sessions = PastSessions(HashEncoder(), CAPACITY, MAX_IDS)
    mine = victims_answer()
    assert sessions.apply(mine) and sessions.count("victim") == 1
    for event in flood(2 * MAX_IDS):  # more than every id held in all
        sessions.apply(event)
    assert not sessions.apply(mine), "the victim's answer delivered again was indexed twice"
    assert sessions.count("victim") == 1
    restored = PastSessions(HashEncoder(), CAPACITY, MAX_IDS)
    restored.restore(sessions.snapshot())
    assert not restored.apply(mine) and restored.count("victim") == 1


def test_the_per_tenant_bound_is_a_setting_below_the_total() -> None:
    settings = RetrieverSettings()
    assert settings.tenant_remembered_event_ids < settings.max_remembered_event_ids
    sessions = PastSessions(HashEncoder(), CAPACITY, MAX_IDS, tenant_event_ids=MAX_IDS // 10)
    mine = victims_answer()
    sessions.apply(mine)
    for event in flood(MAX_IDS // 10 + 1):
        sessions.apply(event)
    assert sessions.apply(flood(1)[0])  # the flood's oldest id was pushed out: its own, none other
    assert not sessions.apply(mine)
