"""lookahead_rag.bench.prefix_hits: what an unbounded per-tenant prefix cache reuses of each prompt."""

from __future__ import annotations

from lookahead_rag.bench.prefix_hits import prefix_hits


def test_each_prompt_hits_its_longest_prefix_shared_with_an_earlier_one() -> None:
    # the third prompt shares 3 tokens with the first and 2 with the second: the longest counts
    prompts = [("t", [1, 2, 3, 4]), ("t", [1, 2, 9, 9]), ("t", [1, 2, 3, 7, 7])]
    assert prefix_hits(prompts) == [0, 2, 3]


def test_tenants_never_share() -> None:
    # the same prompt under another tenant hits nothing
    assert prefix_hits([("a", [5, 6, 7]), ("b", [5, 6, 7]), ("a", [5, 6, 8])]) == [0, 0, 2]


def test_the_last_prompt_token_is_always_computed() -> None:
    # an exact repeat, or a prompt that is a prefix of an earlier one, reuses all but its last token
    assert prefix_hits([("t", [1, 2, 3, 4]), ("t", [1, 2, 3, 4]), ("t", [1, 2])]) == [0, 3, 1]
    assert prefix_hits([("t", [])]) == [0]


def test_later_prompts_are_remembered_too() -> None:
    # the fourth prompt's best match is the third (added after the first two)
    prompts = [("t", [1]), ("t", [2, 3]), ("t", [4, 5, 6]), ("t", [4, 5, 6, 7])]
    assert prefix_hits(prompts) == [0, 0, 0, 3]
