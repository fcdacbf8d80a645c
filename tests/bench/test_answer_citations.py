"""bench quality's citation check on hand-made answers and passages (no model)."""

from __future__ import annotations

from lookahead_rag.bench.answer_citations import answer_span, citation_row, cites_span
from lookahead_rag.services.retriever.citations import CitedPassage

NORMANDY = CitedPassage("Normans", "Normans#0", "The Normans gave their name to Normandy, a region in France.")
DANES = CitedPassage("Danes", "Danes#0", "Danish settlers came from Denmark, Iceland and Norway.")


def test_the_span_is_the_answer_or_a_reference_inside_it() -> None:
    # the whole answer is in a passage: it is the span
    assert answer_span("France", ["France"], [DANES, NORMANDY]) == "france"
    # the answer says more than a passage holds, but contains a reference that one holds: that reference
    assert answer_span("It is in France, I think", ["France"], [NORMANDY]) == "france"
    # neither the answer nor a reference it contains is in any passage: no span
    assert answer_span("Germany", ["Germany"], [NORMANDY, DANES]) is None


def test_a_span_counts_as_cited_only_through_a_passage_holding_it() -> None:
    # the answer's citation names the Normandy passage, which holds "normandy"
    assert cites_span("Normandy", "normandy", [DANES, NORMANDY])
    # the answer cites the Danes passage, which does not hold the span asked about
    assert not cites_span("Denmark, Iceland and Norway", "normandy", [DANES, NORMANDY])


def test_the_row_counts_answers_with_spans_and_abstentions_apart() -> None:
    answers = ["Denmark, Iceland and Norway", "Germany", "The documents do not say."]
    refs = [["Denmark, Iceland and Norway"], ["Germany"], ["France"]]
    row = citation_row(answers, refs, [[DANES, NORMANDY]] * 3)
    # one answer has a span (the first), and it is cited to the passage holding it
    assert row["answers_with_span"] == 1 and row["cited_pct"] == 100.0
    # two answers do not abstain; one of them (the made-up "Germany") has no citation
    assert row["any_citation_pct"] == 50.0


def test_the_abstain_check_is_the_generators_and_counts_each_kind_of_question_apart() -> None:
    from lookahead_rag.bench.answer_citations import abstain_row, withheld
    from lookahead_rag.services.generator.domain import DocumentChunk

    docs = [DocumentChunk(DANES.doc_id, DANES.chunk_id, "", "", DANES.text, 1.0)]
    question = "Where did the settlers come from?"
    assert not withheld("Denmark, Iceland and Norway", docs, question)  # supported: kept
    assert withheld("The settlers did come from there.", docs, question)  # restated: retracted by the generator's check
    assert withheld("The documents do not say.", docs, question)  # abstained in words
    row = abstain_row([("Denmark, Iceland and Norway", docs, question)],
                      [("The elves did come from there.", docs, "Where did the elves come from?"),
                       ("Denmark, Iceland and Norway", docs, "Where did the elves come from?")])
    assert row == {"checked_abstained_pct": 50.0, "checked_wrongly_abstained_pct": 0.0}
