"""Whether the passages support an answer (issue 52, item 1): the pure check on hand-made text."""

from __future__ import annotations

import pytest

from lookahead_rag.services.retriever import grounded
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


def test_an_answer_that_only_restates_the_question_is_not_grounded() -> None:
    question = "Who was the first ruler of Normandy?"
    g = ground("Normandy had a first ruler.", PASSAGES, question, REFUSAL)  # every content word is the question's
    assert not g.grounded
    assert ground("Normandy had Rollo as first ruler.", PASSAGES, question, REFUSAL).grounded  # it adds Rollo


def test_a_made_up_answer_is_marked_grounded_but_cites_nothing() -> None:
    """The tuned cuts ask no support (squad-dev: any cut withheld more answerable questions than
    unanswerable ones): the citations tell a made-up answer."""
    g = ground("The first ruler of Normandy was William in 1066.", PASSAGES, "Who was the first ruler of Normandy?")
    assert g.grounded and g.citations == ()


def test_the_support_cuts_when_raised_withhold_what_the_passages_do_not_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    question = "Who was the first ruler of Normandy?"
    mostly_made_up = ("Rollo was its first ruler. He later sailed to Greenland with twelve ships, founded Reykjavik "
                      "and wrote the sagas of the Icelandic kings in his old age.")
    assert ground("Sky+ HD", PASSAGES, "What does BSkyB offer?", REFUSAL).grounded
    assert ground(mostly_made_up, PASSAGES, question, REFUSAL).grounded
    monkeypatch.setattr(grounded, "MIN_NEW_WORDS_FOUND", 0.5)
    assert not ground("Sky+ HD", PASSAGES, "What does BSkyB offer?", REFUSAL).grounded  # no passage holds Sky or HD
    monkeypatch.setattr(grounded, "MIN_NEW_WORDS_FOUND", 0.0)
    monkeypatch.setattr(grounded, "MIN_SUPPORTED_SHARE", 0.5)
    g = ground(mostly_made_up, PASSAGES, question, REFUSAL)
    assert len(g.citations) == 1 and not g.grounded  # one sentence of the two is supported, the lighter one


def test_the_refusal_claims_nothing_and_counts_as_grounded() -> None:
    assert ground("The documents do not say.", PASSAGES, "Who built Rome?", REFUSAL).grounded
    assert is_refusal("the documents do NOT say", REFUSAL) and not is_refusal("The documents say so.", REFUSAL)
    assert not is_refusal("anything", "")


def test_no_passages_or_no_answer_is_not_grounded() -> None:
    assert not ground("Denmark, Iceland and Norway", [], "From where?", REFUSAL).grounded
    assert not ground("", PASSAGES, "From where?", REFUSAL).grounded
