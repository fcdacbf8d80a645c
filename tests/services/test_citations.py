"""Citations: the passages that support an answer, matched after generation, on the wire and in the event."""

from __future__ import annotations

from lookahead_core import DecodingConfig

from lookahead_rag.services.generator.convert import completed_event, final_to_proto
from lookahead_rag.services.generator.domain import DocumentChunk, FinalInfo, GenerationStats
from lookahead_rag.services.generator.grounding import citations_of
from lookahead_rag.services.generator.prepared import Prepared
from lookahead_rag.services.retriever.citations import Citation, CitedPassage, cite

NORMANS = ("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
           "region in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway.")
OTHER = "The Duchy of Normandy was ruled by dukes; Rollo was its first ruler after the treaty of 911."
PASSAGES = [CitedPassage("Normans#1", "Normans#1#0", OTHER), CitedPassage("Normans#0", "Normans#0#0", NORMANS)]


def test_a_short_answer_cites_the_passage_holding_it_with_its_span() -> None:
    [c] = cite("Denmark, Iceland and Norway", PASSAGES)
    assert (c.doc_id, c.chunk_id) == ("Normans#0", "Normans#0#0")
    assert NORMANS[c.start:c.end] == "Denmark, Iceland and Norway" == c.quote


def test_case_and_punctuation_do_not_hide_support() -> None:
    [c] = cite("france.", PASSAGES)
    assert NORMANS[c.start:c.end] == "France"


def test_each_sentence_cites_its_own_passage() -> None:
    answer = "They came in the 10th and 11th centuries. Rollo was its first ruler."
    cited = cite(answer, PASSAGES)
    assert [c.doc_id for c in cited] == ["Normans#0", "Normans#1"]
    assert cited[0].quote == "in the 10th and 11th centuries" and cited[1].quote == "Rollo was its first ruler"


def test_an_unsupported_answer_or_an_abstention_has_no_citation() -> None:
    assert cite("The documents do not say.", PASSAGES) == []
    assert cite("Sky+ HD", PASSAGES) == []
    assert cite("", PASSAGES) == []
    assert cite("the Normans of the north", PASSAGES) == []  # 2 shared words of 5: not support


def final_with_citations() -> FinalInfo:
    docs = (DocumentChunk("Normans#0", "Normans#0#0", "Normans", "", NORMANS, 0.9),)
    answer = "Denmark, Iceland and Norway"
    return FinalInfo(request_id="r1", stats=GenerationStats(), answer_text=answer, documents=docs,
                     citations=citations_of(answer, docs))


def test_final_info_carries_citations_on_the_wire_and_in_the_event() -> None:
    final = final_with_citations()
    start = NORMANS.index("Denmark")
    assert final.citations == (Citation("Normans#0", "Normans#0#0", start, start + 27, "Denmark, Iceland and Norway"),)
    [wire] = final_to_proto(final).citations
    assert (wire.doc_id, wire.chunk_id, wire.start, wire.end, wire.quote) == (
        "Normans#0", "Normans#0#0", start, start + 27, "Denmark, Iceland and Norway")
    prep = Prepared("acme", "Where did the Norse come from?", [], [], DecodingConfig(), "r1")
    [event_citation] = completed_event(prep, final, "tok", "m", "e1", 0).citations
    assert event_citation == wire
