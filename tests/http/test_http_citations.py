"""The OpenAI endpoint's ``citations`` extension: the passages that support the answer, whole and streamed."""

from __future__ import annotations

from lookahead_rag.services.generator.domain import DocumentChunk, FinalInfo, GenerationStats
from lookahead_rag.services.generator.verdict import verdict
from lookahead_rag.services.http.translate import Reply, StreamTranslator, completion

TEXT = "The Normans came from Denmark, Iceland and Norway in the 10th century."


REFUSAL = "The documents do not say."
QUESTION = "Where did the Normans come from?"
UNSUPPORTED = "The Normans did come from there."  # it restates the question: the check's one cut (grounded.py)


def final(answer: str = "Denmark, Iceland and Norway", mode: str = "flag") -> FinalInfo:
    docs = (DocumentChunk("Normans#0", "Normans#0#0", "Normans", "", TEXT, 0.9),)
    v = verdict(answer, docs, QUESTION, mode, REFUSAL)  # type: ignore[arg-type]
    return FinalInfo(request_id="r1", stats=GenerationStats(finish_reason="eos"), answer_text=v.answer_text,
                     documents=docs, prompt_ids=(1, 2), output_ids=(3,), citations=v.citations, grounded=v.grounded,
                     retracted=v.retracted)


EXPECTED = [{"doc_id": "Normans#0", "chunk_id": "Normans#0#0", "start": TEXT.index("Denmark"),
             "end": TEXT.index(" in the"), "quote": "Denmark, Iceland and Norway"}]


def test_a_whole_completion_carries_its_citations() -> None:
    body = completion(Reply("chatcmpl-r1", "m", 0, token_ids=False, include_usage=False), final())
    assert body["citations"] == EXPECTED


def test_the_streams_finish_chunk_carries_its_citations() -> None:
    chunks = StreamTranslator(Reply("chatcmpl-r1", "m", 0, token_ids=False, include_usage=False)).final(final())
    assert chunks[-1]["citations"] == EXPECTED


def reply() -> Reply:
    return Reply("chatcmpl-r1", "m", 0, token_ids=False, include_usage=False)


def test_a_completion_and_a_finish_chunk_say_whether_the_passages_support_the_answer() -> None:
    assert completion(reply(), final())["grounded"] is True
    assert StreamTranslator(reply()).final(final())[-1]["grounded"] is True
    body = completion(reply(), final(UNSUPPORTED))
    assert body["grounded"] is False and body["citations"] == [] and "retraction" not in body
    assert body["choices"][0]["message"]["content"] == UNSUPPORTED  # flag: kept


def test_abstain_retracts_an_unsupported_answer_in_the_finish_chunk() -> None:
    withdrawn = final(UNSUPPORTED, mode="abstain")
    last = StreamTranslator(reply()).final(withdrawn)[-1]
    assert last["grounded"] is False and last["retraction"] == {"content": REFUSAL}
    assert completion(reply(), withdrawn)["choices"][0]["message"]["content"] == REFUSAL
    kept = StreamTranslator(reply()).final(final(mode="abstain"))[-1]  # a supported answer stays
    assert kept["grounded"] is True and "retraction" not in kept
