"""Past answers speed answers up without steering them: cut where the model ran on, kept out of the prompt
by default (the draft cache still gets them), and shown (when asked) only where their passages support them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore
from lookahead_rag.services.retriever.core import RetrieverCore
from lookahead_rag.services.retriever.corpus import bundled_corpus_path, sample_questions_path
from lookahead_rag.services.retriever.documents import Document
from lookahead_rag.services.retriever.embeddings import Embedder
from lookahead_rag.services.retriever.past_answers import cut_answer
from lookahead_rag.services.retriever.prompt import PAST_HEADER
from lookahead_rag.services.retriever.sessions import PastSessions
from lookahead_rag.v1 import events_pb2
from tests.builders import completed
from tests.services.retriever_helpers import settings, shared_tokenizer

RUNAWAY = "Sky+ HD\n\nQuestion: Who is the UK's largest digital subscription television company?\nAnswer: BSkyB"


def cited(event: events_pb2.GenerationCompleted) -> events_pb2.GenerationCompleted:
    event.citations.add(doc_id="d", chunk_id="d#0", start=0, end=3, quote="abc")
    return event


@pytest.mark.parametrize(("answer", "kept"), [
    (RUNAWAY, "Sky+ HD"),
    ("Use sorted(xs).<|im_end|>\n<|im_start|>user\nHow do I", "Use sorted(xs)."),
    ("Rollo\nQ: Who was Rollo?\nA: a Viking", "Rollo"),
    ("The documents do not say.\n[1] Normans\nThe Normans were", "The documents do not say."),
    ("A: in 1066\nQ: and after?", "A: in 1066"),  # the answer's own label at the start is not a runaway
    ("Use json.dumps(obj, indent=4): it writes the object with four spaces a level.",
     "Use json.dumps(obj, indent=4): it writes the object with four spaces a level."),
])
def test_a_stored_answer_is_cut_where_the_model_ran_on(answer: str, kept: str) -> None:
    assert cut_answer(answer) == kept


def test_sessions_store_the_cut_answer(embedder: Embedder) -> None:
    s = PastSessions(embedder, 10, 100)
    s.apply(completed("a", question="What company did Sky and BSB form?", answer=RUNAWAY))
    [hit] = s.search("a", embedder.encode_one("Sky and BSB merger"), 5)
    assert hit.session.answer == "Sky+ HD"
    assert not hit.session.supported  # no citation: never shown in a prompt


def test_only_supported_answers_are_offered_for_prompts(embedder: Embedder) -> None:
    s = PastSessions(embedder, 10, 100)
    s.apply(completed("a", question="How do I sort a list?", answer="a made-up answer"))
    s.apply(cited(completed("a", question="How do I sort a list in place?", answer="list.sort()")))
    query = embedder.encode_one("sorting a list")
    assert {h.session.answer for h in s.search("a", query, 5)} == {"a made-up answer", "list.sort()"}
    assert [h.session.answer for h in s.search("a", query, 5, supported_only=True)] == ["list.sort()"]
    restored = PastSessions(embedder, 10, 100)
    restored.restore(s.snapshot())
    assert [h.session.answer for h in restored.search("a", query, 5, supported_only=True)] == ["list.sort()"]


@pytest.fixture(scope="module")
def demo_core(embedder: Embedder) -> RetrieverCore:
    """The demo's retriever: the bundled stdlib corpus, one tenant."""
    core = RetrieverCore(settings(), embedder=embedder, tokenizer=shared_tokenizer())
    docs = [json.loads(line) for line in Path(bundled_corpus_path()).read_text(encoding="utf-8").splitlines() if line]
    core.ingest("demo", [Document(d["id"], d.get("title", ""), d["text"], d.get("source", "")) for d in docs])
    return core


def demo_questions(n: int = 3) -> list[str]:
    lines = Path(sample_questions_path()).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["question"] for line in lines if line.strip()][:n]


def test_demo_second_round_prompts_hold_no_other_answer(demo_core: RetrieverCore) -> None:
    """make demo's second round: each question's prompt holds the documents and its own question only,
    never another question's (wrong) first-round answer; the draft cache still gets every answer."""
    questions = demo_questions()
    first_round = [f"WRONG-ANSWER-{n}: {q} Use the count() method of a list comprehension."
                   for n, q in enumerate(questions)]
    store = DraftCacheStore(DraftCacheSettings(data_dir=None), RequestLimits())
    tok = shared_tokenizer()
    for n, (q, a) in enumerate(zip(questions, first_round, strict=True)):
        event = cited(completed("demo", question=q, answer=a + "\n\nQuestion: How do I count?"))
        demo_core.sessions.apply(event)
        assert store.add_output("demo", "tok-a", tok(a, add_special_tokens=False)["input_ids"], f"e{n}")
    assert demo_core.sessions.count("demo") == len(questions)
    for q in questions:
        result = demo_core.retrieve("demo", q, m=3, max_new_tokens=64)
        assert result.sessions == []
        assert PAST_HEADER not in result.prompt and "WRONG-ANSWER" not in result.prompt
        assert "Question: How do I count?" not in result.prompt
        assert result.chunks  # still grounded on the documents
        ids = tok(result.prompt, add_special_tokens=False)["input_ids"]
        assert store.fetch("demo", "tok-a", ids, budget=256)  # the drafts still get the past answers


def test_past_answers_in_prompt_when_asked_are_notes_not_turns(embedder: Embedder) -> None:
    core = RetrieverCore(settings(past_answers_in_prompt=True), embedder=embedder, tokenizer=shared_tokenizer())
    core.ingest("a", [Document("sort", "sorted", "sorted(iterable) returns a new sorted list.")])
    core.sessions.apply(completed("a", question="How do I sort a list?", answer="unsupported guess"))
    core.sessions.apply(cited(completed("a", question="How do I sort a list quickly?", answer=RUNAWAY)))
    result = core.retrieve("a", "How can I sort a list?", m=5)
    assert [s.session.answer for s in result.sessions] == ["Sky+ HD"]
    assert PAST_HEADER in result.prompt and "unsupported guess" not in result.prompt
    assert "\nQ: " not in result.prompt and "Question: Who is" not in result.prompt
