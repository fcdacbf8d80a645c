"""Forget (issue 12, item 5) without a model: the event on the GENERATIONS stream, the draft cache
store, the past sessions, the generator's applier and the Forget writer, on tiny hand-made token lists.

Every consumer applies a ``ForgetRequested`` idempotently (by event id), drops exactly what it
covers (a whole tenant, or the outputs / sessions grounded on one document) and never keeps an
answer that began before a forget covering it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events.forget import CLOCK_SKEW_MS, EVERYTHING, ForgetLedger, forget_event
from lookahead_rag.services.events.inprocess import InProcessBus
from lookahead_rag.services.events.protocols import DRAFTCACHE_GROUP
from lookahead_rag.services.events.streams import GENERATIONS, encode_event, stream_of
from lookahead_rag.services.generator.forget import PrefixForgets
from lookahead_rag.services.retriever.forget import ForgetWriter
from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.v1 import events_pb2
from tests.builders import TOKENIZER, completed
from tests.services.draftcache_helpers import small_settings

NOW_MS = 1_700_000_000_000  # a fixed "now" for event times (the horizons compare these)
LATER_MS = NOW_MS + 10 * CLOCK_SKEW_MS  # well after a forget created at NOW_MS
EARLIER_MS = NOW_MS - 10 * CLOCK_SKEW_MS  # well before it
JSON_OUT = [1, 2, 3, 4, 5, 6]  # an output grounded on the document "json"
CSV_OUT = [11, 12, 13, 14, 15, 16]  # an output grounded on the document "csv"
DIM = 16  # the fake encoder's vector size
CAPACITY, MAX_IDS = 100, 1000  # past sessions per tenant, remembered event ids


# ---- builders --------------------------------------------------------------------------------------
def answer(tenant: str, output: Sequence[int], doc_ids: Sequence[str], *, started_ms: int = LATER_MS,
           question: str = "q", text: str = "a", event_id: str | None = None) -> events_pb2.GenerationCompleted:
    """A GenerationCompleted whose request began at ``started_ms`` (it took one second)."""
    event = completed(tenant, output_ids=output, question=question, answer=text, event_id=event_id,
                      created_unix_ms=started_ms + 1000)
    event.stats.wall_s = 1.0
    event.doc_ids.extend(doc_ids)
    return event


def forget(tenant: str, doc_id: str = EVERYTHING) -> events_pb2.ForgetRequested:
    return forget_event(tenant, doc_id, "req", created_unix_ms=NOW_MS)


def drafted(store: DraftCacheStore, tenant: str, prompt: Sequence[int]) -> set[int]:
    """Every token the store drafts for ``prompt`` (continuations of the tenant's past outputs)."""
    return {t for b in store.fetch(tenant, TOKENIZER, prompt) for t in b.ids}


def outputs(store: DraftCacheStore, tenant: str) -> int:
    return sum(s.outputs for s in store.stats(tenant))


class HashEncoder:
    """A tiny deterministic encoder: words hashed into DIM buckets, normalized (no model)."""

    dim = DIM

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)  # [n, DIM]
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, int(hashlib.sha1(word.encode()).hexdigest(), 16) % DIM] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])


def sessions_of(s: PastSessions, tenant: str) -> list[str]:
    return sorted(hit.session.answer for hit in s.search(tenant, HashEncoder().encode_one("q"), CAPACITY))


# ---- the stream --------------------------------------------------------------------------------------
def test_forget_rides_the_generations_stream_framed() -> None:
    event = forget("acme", "json")
    # it goes where the tenant's answers go, under the same key (ordered with them per partition)
    assert stream_of(event) is GENERATIONS
    assert GENERATIONS.key(event) == GENERATIONS.key(answer("acme", JSON_OUT, []))
    # it comes back as itself
    assert GENERATIONS.decode(encode_event(event)) == event
    # an answer's record is still its bare protobuf (records written before forgets stay readable)
    done = answer("acme", JSON_OUT, ["json"])
    assert encode_event(done) == done.SerializeToString()
    assert GENERATIONS.decode(encode_event(done)) == done
    # a consumer that only knows GenerationCompleted cannot misread a forget as an answer
    with pytest.raises(DecodeError):
        events_pb2.GenerationCompleted.FromString(encode_event(event))


def test_in_process_bus_delivers_answers_and_forgets_in_order() -> None:
    seen: list[str] = []

    class Recorder:
        def apply(self, event: object) -> bool:
            seen.append(type(event).__name__)
            return True

        def snapshot(self) -> bytes:
            return b""

        def restore(self, data: bytes) -> None:
            pass

    async def scenario() -> None:
        bus = InProcessBus()
        bus.subscribe(DRAFTCACHE_GROUP, Recorder())
        await bus.start()
        bus.publish(answer("acme", JSON_OUT, []))
        bus.publish(forget("acme"))
        bus.publish(answer("acme", CSV_OUT, []))
        await bus.drain(timeout_s=5)
        await bus.stop()

    asyncio.run(scenario())
    # one applier receives both types, in publish order
    assert seen == ["GenerationCompleted", "ForgetRequested", "GenerationCompleted"]


# ---- the draft cache store -----------------------------------------------------------------------------
@pytest.fixture
def store() -> DraftCacheStore:
    s = DraftCacheStore(small_settings())
    s.apply(answer("acme", JSON_OUT, ["json"]))
    s.apply(answer("acme", CSV_OUT, ["csv"]))
    s.apply(answer("globex", JSON_OUT, ["json"]))
    return s


def test_store_forget_of_a_tenant_drops_all_its_outputs(store: DraftCacheStore) -> None:
    assert drafted(store, "acme", [1, 2]) and drafted(store, "acme", [11, 12])  # control: cached before
    assert store.apply(forget("acme")) is True
    # nothing of acme drafts any more
    assert drafted(store, "acme", [1, 2]) == set() and drafted(store, "acme", [11, 12]) == set()
    assert outputs(store, "acme") == 0
    # another tenant with the same output is untouched
    assert 3 in drafted(store, "globex", [1, 2])


def test_store_forget_of_a_document_drops_only_outputs_grounded_on_it(store: DraftCacheStore) -> None:
    assert store.apply(forget("acme", "json")) is True
    # the json output no longer drafts, from the trie or as a whole output
    assert drafted(store, "acme", [1, 2]) == set()
    # the csv output still does, and the trie was rebuilt with it alone
    assert 13 in drafted(store, "acme", [11, 12])
    assert outputs(store, "acme") == 1
    # the same document of another tenant is untouched
    assert 3 in drafted(store, "globex", [1, 2])


def test_store_forget_twice_changes_nothing(store: DraftCacheStore) -> None:
    event = forget("acme")
    assert store.apply(event) is True
    store.apply(answer("acme", CSV_OUT, ["csv"]))  # a new answer after the forget is kept
    before = store.snapshot()
    # the same event again (a resend) is a duplicate: it does not wipe the newer output
    assert store.apply(event) is False
    assert store.snapshot() == before
    assert 13 in drafted(store, "acme", [11, 12])


def test_store_keeps_no_answer_that_began_before_the_forget(store: DraftCacheStore) -> None:
    store.apply(forget("acme"))
    # decoding overlapped the forget: the answer arrives after it but began before it
    store.apply(answer("acme", JSON_OUT, ["json"], started_ms=EARLIER_MS))
    assert drafted(store, "acme", [1, 2]) == set()
    # an answer that began after the forget is kept
    store.apply(answer("acme", CSV_OUT, ["csv"], started_ms=LATER_MS))
    assert 13 in drafted(store, "acme", [11, 12])


def test_store_document_horizon_covers_only_that_document() -> None:
    s = DraftCacheStore(small_settings())
    s.apply(forget("acme", "json"))
    s.apply(answer("acme", JSON_OUT, ["json"], started_ms=EARLIER_MS))  # grounded on json: dropped
    s.apply(answer("acme", CSV_OUT, ["csv"], started_ms=EARLIER_MS))  # grounded on csv only: kept
    assert drafted(s, "acme", [1, 2]) == set()
    assert 13 in drafted(s, "acme", [11, 12])


def test_store_snapshot_keeps_doc_ids_and_applied_forgets(store: DraftCacheStore) -> None:
    event = forget("acme", "csv")
    restored = DraftCacheStore(small_settings())
    restored.restore(store.snapshot())
    # the doc ids came back with the outputs: a document forget after the restore is exact
    assert restored.apply(forget("acme", "json")) is True
    assert drafted(restored, "acme", [1, 2]) == set() and 13 in drafted(restored, "acme", [11, 12])
    # the applied forgets come back too: a replay after a restore applies nothing twice
    restored.apply(event)
    again = DraftCacheStore(small_settings())
    again.restore(restored.snapshot())
    assert again.apply(event) is False


def test_store_forget_drops_more_never_less_once_outputs_left_the_log() -> None:
    s = DraftCacheStore(small_settings(max_references=1))  # the log keeps only the latest output
    s.apply(answer("acme", JSON_OUT, ["json"]))
    s.apply(answer("acme", CSV_OUT, ["csv"]))  # the json output left the log (the trie still has it)
    assert 3 in drafted(s, "acme", [1, 2])
    # a forget of the json document cannot find it in the log: the scope is rebuilt from the log alone
    s.apply(forget("acme", "json"))
    assert drafted(s, "acme", [1, 2]) == set()
    assert 13 in drafted(s, "acme", [11, 12])


# ---- past sessions ----------------------------------------------------------------------------------
@pytest.fixture
def sessions() -> PastSessions:
    s = PastSessions(HashEncoder(), CAPACITY, MAX_IDS)
    s.apply(answer("acme", JSON_OUT, ["json"], text="json answer"))
    s.apply(answer("acme", CSV_OUT, ["csv"], text="csv answer"))
    s.apply(answer("acme", CSV_OUT, ["csv", "json"], text="both answer"))
    s.apply(answer("globex", JSON_OUT, ["json"], text="globex json answer"))
    return s


def test_sessions_forget_of_a_tenant(sessions: PastSessions) -> None:
    assert sessions.apply(forget("acme")) is True
    # no session of acme is retrieved any more
    assert sessions_of(sessions, "acme") == [] and sessions.count("acme") == 0
    # globex keeps its own
    assert sessions_of(sessions, "globex") == ["globex json answer"]


def test_sessions_forget_of_a_document(sessions: PastSessions) -> None:
    assert sessions.apply(forget("acme", "json")) is True
    # every session grounded on json goes (also one grounded on json and csv); the rest stays
    assert sessions_of(sessions, "acme") == ["csv answer"]
    assert sessions_of(sessions, "globex") == ["globex json answer"]


def test_sessions_forget_twice_and_overlapping_answers(sessions: PastSessions) -> None:
    event = forget("acme")
    sessions.apply(event)
    sessions.apply(answer("acme", CSV_OUT, ["csv"], text="new answer"))  # began after: kept
    # the resent forget is a duplicate and leaves the newer session alone
    assert sessions.apply(event) is False
    assert sessions_of(sessions, "acme") == ["new answer"]
    # an answer that began before the forget is recorded but never indexed
    assert sessions.apply(answer("acme", JSON_OUT, ["json"], text="late", started_ms=EARLIER_MS)) is True
    assert sessions_of(sessions, "acme") == ["new answer"]


def test_sessions_snapshot_keeps_doc_ids_and_forgets(sessions: PastSessions) -> None:
    event = forget("acme", "csv")
    sessions.apply(event)
    restored = PastSessions(HashEncoder(), CAPACITY, MAX_IDS)
    restored.restore(sessions.snapshot())
    # the applied forget is remembered across the restore
    assert restored.apply(event) is False
    # and doc ids came back: a json forget now removes exactly the json session
    restored.apply(forget("acme", "json"))
    assert sessions_of(restored, "acme") == []
    assert sessions_of(restored, "globex") == ["globex json answer"]


# ---- the ledger ---------------------------------------------------------------------------------------
def test_ledger_horizon_tolerates_clock_skew_and_round_trips() -> None:
    ledger = ForgetLedger()
    assert ledger.admit(forget("acme")) is True
    # an answer starting within the tolerated skew after the forget is still dropped
    assert ledger.covers(answer("acme", [1], [], started_ms=NOW_MS + CLOCK_SKEW_MS - 1))
    assert not ledger.covers(answer("acme", [1], [], started_ms=NOW_MS + CLOCK_SKEW_MS))
    # other tenants have no horizon
    assert not ledger.covers(answer("globex", [1], [], started_ms=EARLIER_MS))
    # the JSON form holds the same horizons and ids
    back = ForgetLedger.from_bytes(ledger.to_bytes())
    assert back.horizons == ledger.horizons and back.applied == ledger.applied


# ---- the generator's applier ----------------------------------------------------------------------------
class FakePrefixCache:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget_tenant(self, tenant: str) -> int:
        self.forgotten.append(tenant)
        return 1


def test_generator_applier_forgets_the_tenants_prefix_kv_once() -> None:
    forgets, cache = PrefixForgets(), FakePrefixCache()
    forgets.attach(cache)
    # answers are not the generator's business
    assert forgets.apply(answer("acme", JSON_OUT, ["json"])) is True and cache.forgotten == []
    event = forget("acme", "json")
    assert forgets.apply(event) is True
    # a document forget drops all of the tenant's prefix KV (any prompt may hold the document)
    assert cache.forgotten == ["acme"]
    # the same event again, also after a restore, does nothing
    assert forgets.apply(event) is False
    restored = PrefixForgets()
    restored.attach(cache)
    restored.restore(forgets.snapshot())
    assert restored.apply(event) is False
    assert cache.forgotten == ["acme"]


# ---- the Forget writer -------------------------------------------------------------------------------------
class Published(list):  # type: ignore[type-arg]
    def publish(self, event: object) -> None:
        self.append(event)


def fake_core(sessions: PastSessions) -> SimpleNamespace:
    return SimpleNamespace(limits=RequestLimits(), settings=SimpleNamespace(max_doc_id_chars=8), sessions=sessions)


def test_forget_writer_validates_publishes_and_applies_here(sessions: PastSessions) -> None:
    published = Published()
    writer = ForgetWriter(fake_core(sessions), published)  # type: ignore[arg-type]
    event_id = writer.forget("acme", "json")
    # one event, with the id the RPC returns, for the tenant and document asked
    assert [(e.event_id, e.tenant, e.doc_id) for e in published] == [(event_id, "acme", "json")]
    # applied to this replica's sessions before the reply
    assert sessions_of(sessions, "acme") == ["csv answer"]
    # what cannot be named is refused before anything is published
    for tenant, doc_id in [("", ""), ("acme", "  "), ("acme", "x" * 9)]:
        with pytest.raises(InvalidArgument):
            writer.forget(tenant, doc_id)
    assert len(published) == 1

