"""The real appliers on Kafka: an answer's event reaches the draft cache's trie and the retriever's
past sessions, and a restarted consumer restores them from its snapshot + offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead_rag.services.draftcache.fetch import Continuation
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.events import DRAFTCACHE_GROUP, RETRIEVER_GROUP
from lookahead_rag.services.events.kafka.broker import LocalBroker
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.v1 import events_pb2
from tests.builders import TOKENIZER, completed
from tests.kafka.helpers import deliver, fast_settings, new_topic, run, started
from tests.services.draftcache_helpers import small_settings
from tests.services.retriever_helpers import shared_embedder

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]
DRAIN_S = 30.0
SESSIONS_PER_TENANT = 100
MAX_EVENT_IDS = 1000
TENANT = "acme"
OUTPUT = [11, 12, 13, 14]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return shared_embedder()


def answer_event(event_id: str, tenant: str = TENANT) -> events_pb2.GenerationCompleted:
    return completed(tenant, event_id=event_id, question="How do I sort a list?", answer="Use sorted(xs).",
                     prompt_ids=[1, 2, 3], output_ids=OUTPUT)


def answers_seen(sessions: PastSessions, embedder: Embedder) -> list[str]:
    query = embedder.encode_one("sorting a list")
    return [hit.session.answer for hit in sessions.search(TENANT, query, 5)]


def test_an_answer_reaches_the_trie_and_the_past_sessions_and_survives_a_restart(
    broker: LocalBroker,
    embedder: Embedder,
    tmp_path: Path,
) -> None:
    settings = fast_settings(broker.bootstrap, new_topic())

    async def serve_once(event: events_pb2.GenerationCompleted) -> tuple[DraftCacheStore, PastSessions, int]:
        store = DraftCacheStore(small_settings())
        sessions = PastSessions(embedder, SESSIONS_PER_TENANT, MAX_EVENT_IDS)
        bus = await started(KafkaBus(settings, tmp_path), {DRAFTCACHE_GROUP: store, RETRIEVER_GROUP: sessions})
        await deliver(bus, [event], DRAIN_S)
        await bus.stop()
        applied = bus.counters(DRAFTCACHE_GROUP).applied + bus.counters(RETRIEVER_GROUP).applied
        return store, sessions, applied

    async def scenario() -> None:
        store, sessions, applied = await serve_once(answer_event("e1"))
        assert applied == 2
        assert store.fetch(TENANT, TOKENIZER, [11, 12], [], 20) == [Continuation(OUTPUT, 1.0)]
        assert answers_seen(sessions, embedder) == ["Use sorted(xs)."]

        # A new process: acme's answer is not read from the log again (only globex's new one is),
        # so it can only be there because both appliers were restored from their snapshots.
        store, sessions, applied = await serve_once(answer_event("e2", tenant="globex"))
        assert applied == 2
        assert store.fetch(TENANT, TOKENIZER, [11, 12], [], 20) == [Continuation(OUTPUT, 1.0)]
        assert answers_seen(sessions, embedder) == ["Use sorted(xs)."]
        assert sessions.count(TENANT) == 1 and sessions.count("globex") == 1

    run(scenario())
