"""The conversation rules (services/common/rules/conversation.py), pure: the follow-up rule of the retrieval
query, turns, the role check and the newest-turns search."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.conversation import (
    check_history,
    leans_on_earlier,
    newest_that_fit,
    retrieval_query,
    split_turns,
)
from lookahead_rag.services.common.rules.limits import RequestLimits

MAX_WORDS = 4  # the follow-up threshold in these cases ([retriever] followup_max_words' default)


@dataclass(frozen=True)
class Msg:
    role: str
    content: str


PREVIOUS = "How do I pretty-print JSON with json.dumps?"
CONVERSATION = [Msg("system", "Be brief."), Msg("user", PREVIOUS), Msg("assistant", "Use indent=2.")]


@pytest.mark.parametrize(("question", "leans"), [
    ("and what about it?", True),  # opens with "and", a pronoun in it
    ("What about sorting keys in the output?", True),  # "what about" opens it, however long
    ("Does it also work for lists of dictionaries?", False),  # a pronoun later on is not an opening
    ("It fails with a TypeError on datetime values", True),  # opens with a pronoun
    ("...and in the csv module?", True),  # an ellipsis opens it
    ("Sorted keys?", True),  # at most MAX_WORDS words
    ("How do I read a CSV file line by line?", False),  # stands on its own
    ("How to read CSV?", True),  # exactly MAX_WORDS words: short enough to lean
])
def test_leans_on_earlier(question: str, leans: bool) -> None:
    assert leans_on_earlier(question, MAX_WORDS) is leans


def test_threshold_zero_leaves_only_the_openers() -> None:
    # max_words 0: a short question stands alone, an opener still leans
    assert not leans_on_earlier("Sorted keys?", 0)
    assert leans_on_earlier("and sorted keys?", 0)


def test_follow_up_is_searched_with_the_previous_user_turn() -> None:
    # the previous user turn (not the assistant's, not the system's), then the question
    assert retrieval_query("and sorted keys?", CONVERSATION, MAX_WORDS) == f"{PREVIOUS}\nand sorted keys?"
    standalone = "How do I read a CSV file line by line?"
    # a question that stands alone is searched alone
    assert retrieval_query(standalone, CONVERSATION, MAX_WORDS) == standalone
    # no earlier user turn: the question alone, however short
    assert retrieval_query("and sorted keys?", CONVERSATION[:1], MAX_WORDS) == "and sorted keys?"


def test_split_turns() -> None:
    history = [Msg("assistant", "Hello!"), Msg("developer", "Be brief."), Msg("user", "q1"), Msg("assistant", "a1"),
               Msg("assistant", "a1 more"), Msg("system", "Mind the units."), Msg("user", "q2")]
    system, turns = split_turns(history)
    # system and developer texts, in order; a turn is a user message and the replies after it
    assert system == ["Be brief.", "Mind the units."]
    assert turns == [(("assistant", "Hello!"),),
                     (("user", "q1"), ("assistant", "a1"), ("assistant", "a1 more")),
                     (("user", "q2"),)]


def test_check_history() -> None:
    limits = RequestLimits(max_prompt_chars=20)
    check_history([Msg("developer", "x"), Msg("user", "y"), Msg("assistant", "z")], limits)  # all allowed
    # a role outside the four: one line naming the message and its role
    with pytest.raises(InvalidArgument, match=r"^history message 1: role 'tool' is not allowed"):
        check_history([Msg("user", "y"), Msg("tool", "{}")], limits)
    # all the messages' characters count against max_prompt_chars
    with pytest.raises(InvalidArgument, match="history: 21 characters; the limit is 20"):
        check_history([Msg("user", "x" * 10), Msg("assistant", "y" * 11)], limits)


@pytest.mark.parametrize("fitting", [0, 1, 5, 9, 10])
def test_newest_that_fit_is_the_largest_count_that_fits(fitting: int) -> None:
    calls: list[int] = []

    def fits(n: int) -> bool:
        calls.append(n)
        return n <= fitting

    # the largest count that fits, found in about log2(count) tries
    assert newest_that_fit(fits, 10) == fitting
    assert len(calls) <= 4
