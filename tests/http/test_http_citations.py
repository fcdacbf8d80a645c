"""The OpenAI endpoint's ``citations`` extension: the passages that support the answer, whole and streamed."""

from __future__ import annotations

from lookahead_rag.services.generator.domain import DocumentChunk, FinalInfo, GenerationStats
from lookahead_rag.services.generator.grounding import citations_of
from lookahead_rag.services.http.translate import Reply, StreamTranslator, completion

TEXT = "The Normans came from Denmark, Iceland and Norway in the 10th century."


def final() -> FinalInfo:
    docs = (DocumentChunk("Normans#0", "Normans#0#0", "Normans", "", TEXT, 0.9),)
    answer = "Denmark, Iceland and Norway"
    return FinalInfo(request_id="r1", stats=GenerationStats(finish_reason="eos"), answer_text=answer,
                     documents=docs, prompt_ids=(1, 2), output_ids=(3,), citations=citations_of(answer, docs))


EXPECTED = [{"doc_id": "Normans#0", "chunk_id": "Normans#0#0", "start": TEXT.index("Denmark"),
             "end": TEXT.index(" in the"), "quote": "Denmark, Iceland and Norway"}]


def test_a_whole_completion_carries_its_citations() -> None:
    body = completion(Reply("chatcmpl-r1", "m", 0, token_ids=False, include_usage=False), final())
    assert body["citations"] == EXPECTED


def test_the_streams_finish_chunk_carries_its_citations() -> None:
    chunks = StreamTranslator(Reply("chatcmpl-r1", "m", 0, token_ids=False, include_usage=False)).final(final())
    assert chunks[-1]["citations"] == EXPECTED
