"""Past sessions: the retriever's event applier (idempotent, per tenant, snapshot/restore)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.v1 import events_pb2
from tests.builders import completed
from tests.services.retriever_helpers import settings, shared_tokenizer

CAPACITY = 100
MAX_IDS = 1000


@pytest.fixture
def sessions(embedder: Embedder) -> PastSessions:
    return PastSessions(embedder, CAPACITY, MAX_IDS)


def search(s: PastSessions, embedder: Embedder, tenant: str, question: str, m: int = 5) -> list[str]:
    return [hit.session.answer for hit in s.search(tenant, embedder.encode_one(question), m)]


def test_same_event_twice_is_applied_once(sessions: PastSessions, embedder: Embedder) -> None:
    event = completed("a", question="How do I sort a list?", answer="Use sorted(xs).")
    assert sessions.apply(event) is True
    assert sessions.apply(event) is False
    assert sessions.count("a") == 1
    assert search(sessions, embedder, "a", "sorting a list") == ["Use sorted(xs)."]


def test_tenants_never_see_each_others_sessions(sessions: PastSessions, embedder: Embedder) -> None:
    sessions.apply(completed("a", question="How do I sort a list?", answer="A: use sorted."))
    sessions.apply(completed("b", question="How do I sort a list?", answer="B: secret answer."))
    sessions.apply(completed("b", question="How do I reverse a list?", answer="B: reversed."))
    assert search(sessions, embedder, "a", "How do I sort a list?") == ["A: use sorted."]
    assert set(search(sessions, embedder, "b", "How do I sort a list?")) == {
        "B: secret answer.",
        "B: reversed.",
    }
    assert search(sessions, embedder, "c", "How do I sort a list?") == []
    assert sessions.count("a") == 1 and sessions.count("b") == 2 and sessions.count() == 3


def test_best_match_comes_first(sessions: PastSessions, embedder: Embedder) -> None:
    sessions.apply(completed("a", question="What is the capital of France?", answer="Paris."))
    sessions.apply(completed("a", question="How do I read a CSV file in Python?", answer="Use csv.reader."))
    hits = sessions.search("a", embedder.encode_one("reading csv files with python"), 2)
    assert [h.session.answer for h in hits] == ["Use csv.reader.", "Paris."]
    assert hits[0].score > hits[1].score


def test_snapshot_restore_roundtrip_keeps_sessions_and_applied_ids(
    sessions: PastSessions, embedder: Embedder
) -> None:
    first = completed("a", question="How do I sort a list?", answer="Use sorted.")
    sessions.apply(first)
    sessions.apply(completed("b", question="How do I open a file?", answer="Use open()."))
    blob = sessions.snapshot()
    fresh = PastSessions(embedder, CAPACITY, MAX_IDS)
    fresh.restore(blob)
    assert fresh.apply(first) is False  # dedup state travelled with the snapshot
    assert fresh.count("a") == 1 and fresh.count("b") == 1
    assert search(fresh, embedder, "b", "open a file") == ["Use open()."]
    assert fresh.snapshot() == blob


def test_restore_replaces_state(sessions: PastSessions, embedder: Embedder) -> None:
    empty = sessions.snapshot()
    sessions.apply(completed("a", question="q?", answer="an answer"))
    sessions.restore(empty)
    assert sessions.count() == 0 and sessions.tenants() == []


def test_events_without_question_are_consumed_but_not_indexed(sessions: PastSessions) -> None:
    raw = completed("a", question="", answer="generated text")
    assert sessions.apply(raw) is True
    assert sessions.apply(raw) is False
    assert sessions.count() == 0


def test_oldest_sessions_are_evicted_beyond_capacity(embedder: Embedder) -> None:
    small = PastSessions(embedder, max_per_tenant=2, max_event_ids=MAX_IDS)
    for n in range(3):
        small.apply(completed("a", question=f"question number {n}", answer=f"answer {n}"))
    assert small.count("a") == 2
    assert sorted(search(small, embedder, "a", "question number")) == ["answer 1", "answer 2"]


def test_event_without_id_is_rejected(sessions: PastSessions) -> None:
    with pytest.raises(ValueError, match="event_id"):
        sessions.apply(events_pb2.GenerationCompleted(tenant="a", question="q", answer_text="a"))


# ---- through RetrieverCore: prompts and restarts ------------------------------------------------------


def make_core(embedder: Embedder, data_dir: Path | None, **overrides: object) -> RetrieverCore:
    return RetrieverCore(settings(data_dir, **overrides), embedder=embedder, tokenizer=shared_tokenizer())


def supported(event: events_pb2.GenerationCompleted) -> events_pb2.GenerationCompleted:
    """``event`` with a citation: its passages support it, so a prompt may show it."""
    event.citations.add(doc_id="d", chunk_id="d#0", start=0, end=1, quote="x")
    return event


def test_prompt_holds_own_tenants_past_answers_only(embedder: Embedder) -> None:
    core = make_core(embedder, None, past_answers_in_prompt=True)
    core.sessions.apply(supported(completed("a", question="How do I sort a list?",
                                            answer="ANSWER-FOR-A: use sorted().")))
    core.sessions.apply(supported(completed("b", question="How do I sort a list?", answer="ANSWER-FOR-B: secret.")))
    result = core.retrieve("a", "How can I sort a list?", m=5)
    assert [s.session.answer for s in result.sessions] == ["ANSWER-FOR-A: use sorted()."]
    assert "ANSWER-FOR-A" in result.prompt and "ANSWER-FOR-B" not in result.prompt
    assert "has no documents" in result.notes[0]


def test_past_sessions_survive_a_restart(tmp_path: Path, embedder: Embedder) -> None:
    core = make_core(embedder, tmp_path)
    event = completed("a", question="How do I sort a list?", answer="Use sorted().")
    core.sessions.apply(event)
    core.close()
    reloaded = make_core(embedder, tmp_path)
    assert reloaded.sessions.count("a") == 1
    assert reloaded.sessions.apply(event) is False
