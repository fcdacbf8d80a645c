"""Citations: the passages that support an answer, matched after generation, on the wire and in the event."""

from __future__ import annotations

from lookahead_core import DecodingConfig

from lookahead_rag.services.generator.convert import completed_event, final_to_proto
from lookahead_rag.services.generator.domain import DocumentChunk, FinalInfo, GenerationStats
from lookahead_rag.services.generator.prepared import Prepared
from lookahead_rag.services.generator.verdict import verdict
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


QUESTION = "Where did the Norse come from?"


def final_with_citations() -> FinalInfo:
    docs = (DocumentChunk("Normans#0", "Normans#0#0", "Normans", "", NORMANS, 0.9),)
    answer = "Denmark, Iceland and Norway"
    v = verdict(answer, docs, QUESTION, "flag", "The documents do not say.")
    return FinalInfo(request_id="r1", stats=GenerationStats(), answer_text=answer, documents=docs,
                     citations=v.citations, grounded=v.grounded)


def test_final_info_carries_citations_on_the_wire_and_in_the_event() -> None:
    final = final_with_citations()
    start = NORMANS.index("Denmark")
    assert final.citations == (Citation("Normans#0", "Normans#0#0", start, start + 27, "Denmark, Iceland and Norway"),)
    [wire] = final_to_proto(final).citations
    assert (wire.doc_id, wire.chunk_id, wire.start, wire.end, wire.quote) == (
        "Normans#0", "Normans#0#0", start, start + 27, "Denmark, Iceland and Norway")
    prep = Prepared("acme", QUESTION, [], [], DecodingConfig(), "r1")
    event = completed_event(prep, final, "tok", "m", "e1", 0)
    [event_citation] = event.citations
    assert event_citation == wire


def test_grounded_travels_on_the_wire_and_in_the_event_and_unchecked_stays_unset() -> None:
    final = final_with_citations()
    prep = Prepared("acme", QUESTION, [], [], DecodingConfig(), "r1")
    for message in (final_to_proto(final), completed_event(prep, final, "tok", "m", "e1", 0)):
        assert message.HasField("grounded") and message.grounded and not message.retracted
    withdrawn = FinalInfo(request_id="r2", stats=GenerationStats(), answer_text="No.", grounded=False, retracted=True)
    assert final_to_proto(withdrawn).retracted and not final_to_proto(withdrawn).grounded
    assert completed_event(prep, withdrawn, "tok", "m", "e2", 0).retracted
    unchecked = FinalInfo(request_id="r3", stats=GenerationStats())  # a raw Generate, a safe stream
    assert not final_to_proto(unchecked).HasField("grounded")


# ---- which passage a sentence or a short answer is tied to (issue 52, item 2) ---------------------------
ECHO = CitedPassage("Echo#0", "Echo#0#0", "Who was the first ruler of Normandy is a question historians of Normandy "
                    "still argue about, since the first ruler left few records.")
ROLLO = CitedPassage("Normans#1", "Normans#1#0", OTHER)


def test_a_sentence_answer_cites_the_passage_holding_its_new_words_not_the_one_echoing_the_question() -> None:
    [c] = cite("The first ruler of Normandy was Rollo.", [ECHO, ROLLO], "Who was the first ruler of Normandy?")
    assert c.chunk_id == "Normans#1#0"
    assert "Rollo" in c.quote and "911" not in c.quote  # the supporting text, not the whole chunk


def test_a_sentence_answer_cites_the_passage_holding_the_short_span_inside_it() -> None:
    answer = "The Norse raiders who settled there came from Denmark, Iceland and Norway, long ago."
    [c] = cite(answer, PASSAGES, "From which countries did the Norse originate?")
    assert c.chunk_id == "Normans#0#0"
    assert c.quote == "Norse raiders and pirates from Denmark, Iceland and Norway"


def test_a_short_answer_cites_the_passage_it_was_copied_from() -> None:
    capital = CitedPassage("Paris#0", "Paris#0#0", "Paris, on the Seine, is the capital of France.")
    region = CitedPassage("Normandy#0", "Normandy#0#0", "Normandy is a region in the north of France.")
    [c] = cite("France", [capital, region], "In what country is Normandy located?")
    assert c.chunk_id == "Normandy#0#0"  # both hold the word: the one holding the question's words
    scrambled = CitedPassage("List#0", "List#0#0", "Norway, Denmark and Iceland sent settlers.")
    [c] = cite("Denmark, Iceland and Norway", [scrambled, PASSAGES[1]])
    assert c.chunk_id == "Normans#0#0"  # the one holding it word for word, though both hold its words


def test_inflections_match_and_the_span_spans_the_matched_words_only() -> None:
    text = ("Byzantium was weak. The further decline paved the road to a third attack in 1185, when a large Norman "
            "army invaded Dyrrachium. Later the city recovered and traded with Venice for a century.")
    [c] = cite("The Normans attacked Dyrrachium in 1185.", [CitedPassage("D", "D#0", text)],
               "When did the Normans attack Dyrrachium?")
    assert c.quote == "attack in 1185, when a large Norman army invaded Dyrrachium"
    assert text[c.start:c.end] == c.quote
