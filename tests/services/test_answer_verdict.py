"""The generator's verdict on an answer (issue 52, item 1) and its place off the event loop (issue 51, finding 5)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lookahead_rag.services.generator.domain import DocumentChunk
from lookahead_rag.services.generator.settings import REFUSAL, GeneratorSettings
from lookahead_rag.services.generator.verdict import AnswerCheck, verdict

NORMANS = ("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region "
           "in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway.")
DOCS = (DocumentChunk("Normans#0", "Normans#0#0", "Normans", "", NORMANS, 0.9),)
QUESTION = "From which countries did the Norse originate?"
UNSUPPORTED = "The Norse did originate from countries."  # it restates the question: nothing a passage could hold


def test_flag_keeps_an_unsupported_answer_and_marks_it() -> None:
    v = verdict(UNSUPPORTED, DOCS, QUESTION, "flag", REFUSAL)
    assert (v.answer_text, v.grounded, v.retracted, v.citations) == (UNSUPPORTED, False, False, ())
    v = verdict("Denmark, Iceland and Norway", DOCS, QUESTION, "flag", REFUSAL)
    assert v.grounded and [c.chunk_id for c in v.citations] == ["Normans#0#0"]


def test_abstain_replaces_an_unsupported_answer_by_the_refusal() -> None:
    v = verdict(UNSUPPORTED, DOCS, QUESTION, "abstain", REFUSAL)
    assert (v.answer_text, v.grounded, v.retracted, v.citations) == (REFUSAL, False, True, ())
    assert not verdict("Denmark, Iceland and Norway", DOCS, QUESTION, "abstain", REFUSAL).retracted
    assert not verdict(REFUSAL, DOCS, QUESTION, "abstain", REFUSAL).retracted  # the refusal is not refused again
    assert verdict("Denmark", (), QUESTION, "abstain", REFUSAL).retracted  # no documents: nothing supports it


def test_a_raw_generate_is_not_checked() -> None:
    v = verdict(UNSUPPORTED, (), "", "abstain", REFUSAL)
    assert (v.answer_text, v.grounded, v.retracted) == (UNSUPPORTED, None, False)


def test_the_setting_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GeneratorSettings().ungrounded == "flag" and GeneratorSettings().refusal == REFUSAL
    monkeypatch.setenv("LAR_GENERATOR_UNGROUNDED", "abstain")
    assert GeneratorSettings().ungrounded == "abstain"
    monkeypatch.setenv("LAR_GENERATOR_UNGROUNDED", "maybe")
    with pytest.raises(ValueError, match="ungrounded"):
        GeneratorSettings()


# ---- the check off the event loop ---------------------------------------------------------------------
ANSWERS = 16  # n: answers finishing at once
PASSAGES = 16  # k
PASSAGE_WORDS = 250  # a chunk's words
ANSWER_WORDS = 400  # about 512 tokens
SENTENCE_WORDS = 20
MAX_LAG_S = 0.05


def vocabulary_text(seed: int, n: int) -> str:
    """``n`` words drawn from a small vocabulary (many shared words between passages and the answer)."""
    words = [f"w{(seed * 7919 + i * 104729) % 600}" for i in range(n)]
    return " ".join(w + ("." if (i + 1) % SENTENCE_WORDS == 0 else "") for i, w in enumerate(words))


@pytest.mark.asyncio
async def test_sixteen_answers_citations_leave_the_event_loop_free(caplog: pytest.LogCaptureFixture) -> None:
    """n=16 answers of ~512 tokens, k=16 passages each, checked at once: no step of the event loop takes
    50 ms (asyncio's debug mode reports each callback that holds the loop longer; on the loop, as before,
    each answer's check was one such step: ~50 ms for one answer, 16 in a row)."""
    docs = tuple(DocumentChunk(f"d{i}", f"d{i}#0", "", "", vocabulary_text(i, PASSAGE_WORDS), 0.5)
                 for i in range(PASSAGES))
    copied = " ".join(" ".join(d.text.rstrip(".").split()[:SENTENCE_WORDS // 2]) + "." for d in docs)  # held spans
    answer = " ".join([copied, vocabulary_text(PASSAGES, ANSWER_WORDS - len(copied.split()))])
    check = AnswerCheck("flag", REFUSAL)
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = MAX_LAG_S
    caplog.set_level(logging.WARNING, logger="asyncio")
    try:
        verdicts = await asyncio.gather(*(check(answer, docs, "w1 w2?") for _ in range(ANSWERS)))
    finally:
        loop.set_debug(False)
        check.close()
    assert all(v.citations for v in verdicts)  # the work was done
    stalls = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
    assert not stalls, stalls
