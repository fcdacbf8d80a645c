"""The one context-window arithmetic (services/common/rules/context.py): a prompt and its answer must fit."""

from __future__ import annotations

import pytest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.context import check_fits, context_room


def test_room_is_what_is_left_and_none_for_an_unknown_window() -> None:
    assert context_room(8192, 8000) == 192
    assert context_room(100, 120) == -20  # over the window
    assert context_room(0, 8000) is None  # unknown: nothing is bounded


def test_a_prompt_fits_with_its_answer_up_to_the_last_token() -> None:
    check_fits(8000, 192, 8192)
    check_fits(10**6, 10**6, 0)  # unknown window: never refused
    with pytest.raises(InvalidArgument, match="prompt of 8000 tokens \\+ max_new_tokens 193 does not fit "
                                              "the model's context of 8192"):
        check_fits(8000, 193, 8192)
