"""Issue 32 item 6: the kernel an answer's forwards ran and the draft budget it was granted move with
the other tenants' load (a bigger batch picks another kernel twin and splits the budget), so a tenant's
key gets neither in the final stats; an admin key does, and /metrics keeps them."""

from __future__ import annotations

from lookahead_rag.services.common.auth.callers import Principal, sees_engine_load
from lookahead_rag.services.common.auth.scopes import Scope
from lookahead_rag.services.generator.convert import chunk_to_proto
from lookahead_rag.services.generator.domain import FinalInfo, GenerationStats

LOADED = GenerationStats(new_tokens=3, mean_draft_budget=7.5, kernel="packed,split", finish_reason="eos")
TENANT = Principal("key k1", frozenset({"acme"}), frozenset({Scope.ANSWER}))
ADMIN = Principal("key k2", frozenset({"*"}), frozenset({Scope.ANSWER, Scope.ADMIN}))


def test_a_tenant_key_gets_no_kernel_and_no_draft_budget() -> None:
    hidden = chunk_to_proto(FinalInfo("r", stats=LOADED), sees_engine_load(TENANT)).final.stats
    assert (hidden.kernel, hidden.mean_draft_budget, hidden.new_tokens) == ("", 0.0, 3)


def test_an_admin_key_still_gets_them() -> None:
    shown = chunk_to_proto(FinalInfo("r", stats=LOADED), sees_engine_load(ADMIN)).final.stats
    assert (shown.kernel, shown.mean_draft_budget) == ("packed,split", 7.5)
