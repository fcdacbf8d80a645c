"""Issue 22, item 4: tenant A's forgets cannot be used against tenant B.

The forget ledgers keep horizons and applied forget ids per tenant: A's flood (more than any cap)
pushes out only A's own, so B's answer that began before B's forget is still dropped and B's forget,
delivered again, is still a duplicate, in every consumer (past sessions, draft cache, the generator's
prefix forgets), also after a restore from a snapshot saved before ledgers were per tenant. And the
Forget RPC counts against the tenant's rate: past it, RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import io
import json
from types import SimpleNamespace

import grpc
import numpy as np

from lookahead_rag.services.common.rpc.grpcutil import open_channel, start_server, stop_server
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache import codec
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.forget import MAX_HORIZONS, ForgetLedger, forget_event
from lookahead_rag.services.generator.forget import PrefixForgets
from lookahead_rag.services.retriever.forget import ForgetWriter
from lookahead_rag.services.retriever.servicer import SERVICE_NAME, RetrieverServicer
from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.v1 import events_pb2, retriever_pb2, retriever_pb2_grpc
from tests.services.draftcache_helpers import small_settings
from tests.services.test_forget import DIM, EARLIER_MS, LATER_MS, NOW_MS, HashEncoder, answer

CAP = 8  # a small ledger's caps (the consumers' own are MAX_HORIZONS and friends)
OUTPUT = [1, 2, 3, 4, 5, 6]  # B's answer, grounded on B's document "json"
CAPACITY, MAX_IDS = 100, 1000  # past sessions per tenant, remembered answer ids
BURST = 3  # forgets a tenant may send at once
SLOW_RPS = 0.001  # then one per 1000 s: nothing refills during the test
DOC_ID_CHARS = 64


def flood(tenant: str, count: int) -> list[events_pb2.ForgetRequested]:
    """``count`` forgets of distinct documents of ``tenant``, all created at NOW_MS (ids: no uuid, faster)."""
    return [events_pb2.ForgetRequested(event_id=f"{tenant}-flood-{i}", tenant=tenant, doc_id=f"doc-{i}",
                                       created_unix_ms=NOW_MS) for i in range(count)]


def b_forget() -> events_pb2.ForgetRequested:
    return forget_event("b", "json", created_unix_ms=NOW_MS)


def early(tenant: str = "b") -> events_pb2.GenerationCompleted:
    """An answer grounded on "json" that began before the forget but arrives after it."""
    return answer(tenant, OUTPUT, ["json"], started_ms=EARLIER_MS, question="q b", text=f"{tenant} early")


# ---- the ledger -----------------------------------------------------------------------------------------
def test_a_flood_past_the_ledgers_cap_leaves_b_s_horizon_and_id() -> None:
    ledger = ForgetLedger(max_horizons=CAP, max_ids=CAP)
    forget = b_forget()
    assert ledger.admit(forget)
    for event in flood("a", 4 * CAP):
        assert ledger.admit(event)
    # B: its answer begun before its forget is still dropped, its forget is still known
    assert ledger.covers(early("b"))
    assert not ledger.admit(forget)
    # A dropped only its own, and its guarantee holds too: old document horizons fold into "everything"
    assert ledger.covers(answer("a", OUTPUT, ["doc-0"], started_ms=EARLIER_MS))
    assert not ledger.covers(answer("a", OUTPUT, ["doc-0"], started_ms=LATER_MS))
    assert len(ledger.applied) <= CAP and ("b", forget.event_id) in ledger.applied


def test_each_tenant_keeps_at_most_its_own_cap() -> None:
    ledger = ForgetLedger(tenant_horizons=CAP, tenant_ids=CAP)
    forget = b_forget()
    ledger.admit(forget)
    for event in flood("a", 4 * CAP):
        ledger.admit(event)
    horizons = ledger.horizons
    assert sum(tenant == "a" for tenant, _ in horizons) <= CAP + 1  # its documents, and its "everything"
    assert sum(tenant == "a" for tenant, _ in ledger.applied) == CAP
    assert horizons[("b", "json")] == NOW_MS and ledger.covers(early("b"))
    assert not ledger.admit(forget)
    # the JSON form keeps the tenants apart
    back = ForgetLedger.from_bytes(ledger.to_bytes())
    assert back.horizons == horizons and back.applied == ledger.applied


# ---- every consumer, at its real caps, restored from snapshots saved before (bare ids) -------------------
def old_ledger(forget: events_pb2.ForgetRequested) -> dict[str, list]:  # type: ignore[type-arg]
    """The JSON a ledger wrote before issue 22: global horizons, bare forget ids."""
    return {"horizons": [[forget.tenant, forget.doc_id, forget.created_unix_ms]], "applied": [forget.event_id]}


def old_sessions_snapshot(ledger: dict[str, list]) -> bytes:  # type: ignore[type-arg]
    """A version 2 past-sessions snapshot (no sessions) holding ``ledger``."""
    meta = {"version": 2, "dim": DIM, "applied": [], "forgets": ledger, "tenants": []}
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    return buf.getvalue()


def test_a_flood_reaches_no_other_tenant_in_any_consumer() -> None:
    forget = b_forget()
    sessions = PastSessions(HashEncoder(), CAPACITY, MAX_IDS)
    sessions.restore(old_sessions_snapshot(old_ledger(forget)))
    store = DraftCacheStore(small_settings())
    store.restore(codec.encode(codec.StoreState(ledger=json.dumps(old_ledger(forget)).encode())))
    prefixes = PrefixForgets()
    prefixes.restore(json.dumps({"applied": [forget.event_id]}).encode())
    for event in flood("a", MAX_HORIZONS + 1):  # more than every ledger held in all, before
        sessions.apply(event)
        store.apply(event)
        prefixes.apply(event)
    # B's answer that began before B's forget is recorded but kept nowhere
    assert sessions.apply(early("b")) and sessions.count("b") == 0
    assert store.apply(early("b")) and store.stats("b") == []
    # B's forget delivered again is a duplicate everywhere
    assert not sessions.apply(forget) and not store.apply(forget) and not prefixes.apply(forget)
    # an answer of B begun after the forget is kept as ever
    later = answer("b", OUTPUT, ["json"], started_ms=LATER_MS, question="q b", text="b later")
    assert sessions.apply(later) and sessions.count("b") == 1


# ---- the Forget RPC counts against the tenant's rate -----------------------------------------------------
class Published(list):  # type: ignore[type-arg]
    def publish(self, event: object) -> None:
        self.append(event)


async def forget_calls(servicer: RetrieverServicer, calls: list[str]) -> list[grpc.StatusCode]:
    """Each tenant's Forget over real gRPC, in order: the status code of each call."""
    server, port = await start_server([(retriever_pb2_grpc.add_RetrieverServicer_to_server, servicer)],
                                      [SERVICE_NAME])
    codes: list[grpc.StatusCode] = []
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            for tenant in calls:
                try:
                    await stub.Forget(retriever_pb2.ForgetRequest(tenant=tenant, doc_id="json"))
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code())
    finally:
        await stop_server(server, grace_s=1.0)
    return codes


def test_forget_past_the_tenants_rate_is_resource_exhausted() -> None:
    limits = RequestLimits(tenant_rps=SLOW_RPS, tenant_burst=BURST)
    core = SimpleNamespace(limits=limits, settings=SimpleNamespace(max_doc_id_chars=DOC_ID_CHARS),
                           sessions=PastSessions(HashEncoder(), CAPACITY, MAX_IDS))
    published = Published()
    servicer = RetrieverServicer(core, forgetter=ForgetWriter(core, published))  # type: ignore[arg-type]
    codes = asyncio.run(forget_calls(servicer, ["a"] * (BURST + 2) + ["b"]))
    ok, exhausted = grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED
    # A's burst passes, the rest is refused; B has its own quota
    assert codes == [ok] * BURST + [exhausted] * 2 + [ok]
    # a refused forget is neither applied nor published
    assert [e.tenant for e in published] == ["a"] * BURST + ["b"]
