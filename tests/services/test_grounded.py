"""Whether the passages support an answer (issue 52, item 1): the pure check on hand-made text."""

from __future__ import annotations

from lookahead_rag.services.retriever.citations import CitedPassage
from lookahead_rag.services.retriever.grounded import ground, is_refusal

REFUSAL = "The documents do not say."
NORMANS = CitedPassage("Normans#0", "Normans#0#0", (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in "
    "France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway."))
ROLLO = CitedPassage("Normans#1", "Normans#1#0",
                     "The Duchy of Normandy was ruled by dukes; Rollo was its first ruler after the treaty of 911.")
PASSAGES = [NORMANS, ROLLO]


def test_an_answer_a_passage_holds_is_grounded_and_cited() -> None:
    g = ground("Denmark, Iceland and Norway", PASSAGES, "From which countries did the Norse originate?", REFUSAL)
    assert g.grounded and [c.chunk_id for c in g.citations] == ["Normans#0#0"]
    g = ground("The first ruler of Normandy was Rollo.", PASSAGES, "Who was the first ruler of Normandy?", REFUSAL)
    assert g.grounded and [c.chunk_id for c in g.citations] == ["Normans#1#0"]


def test_a_made_up_answer_is_not_grounded() -> None:
    assert not ground("Sky+ HD", PASSAGES, "What does BSkyB offer?", REFUSAL).grounded
    # it echoes the question, but what it adds (William, 1066) no passage holds
    g = ground("The first ruler of Normandy was William in 1066.", PASSAGES, "Who was the first ruler of Normandy?")
    assert not g.grounded and g.citations == ()


def test_an_answer_mostly_made_up_is_not_grounded_though_one_sentence_is_cited() -> None:
    answer = ("Rollo was its first ruler. He later sailed to Greenland with twelve ships, founded Reykjavik and "
              "wrote the sagas of the Icelandic kings in his old age.")
    g = ground(answer, PASSAGES, "Who was the first ruler of Normandy?", REFUSAL)
    assert len(g.citations) == 1 and not g.grounded


def test_the_refusal_claims_nothing_and_counts_as_grounded() -> None:
    assert ground("The documents do not say.", PASSAGES, "Who built Rome?", REFUSAL).grounded
    assert is_refusal("the documents do NOT say", REFUSAL) and not is_refusal("The documents say so.", REFUSAL)
    assert not is_refusal("anything", "")


def test_no_passages_or_no_answer_is_not_grounded() -> None:
    assert not ground("Denmark, Iceland and Norway", [], "From where?", REFUSAL).grounded
    assert not ground("", PASSAGES, "From where?", REFUSAL).grounded
