"""services/generator/past_outputs.py: whole past answers follow the answer header in a request's trie."""

from __future__ import annotations

from typing import Any

from lookahead_core.config import DecodingConfig
from lookahead_core.drafting.draft import retrieve_draft
from lookahead_core.drafting.trie import TokenTrie

from services.generator.past_outputs import PastOutput, answer_header, fill_trie

HEADER = [6, 7, 8]  # the template's answer header (``<|im_start|>assistant\n``)
PROMPT = [1, 2, 3, 4, *HEADER]  # a chat prompt ends with it
ANSWER = list(range(10, 60))  # a past answer the tenant was given


class ChatTokenizer:
    """A stand-in tokenizer whose template ends a prompt with HEADER when asked to open the answer."""

    chat_template = "stand-in"

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                            tokenize: bool) -> list[int]:
        return [1, 2, 3, 4, *(HEADER if add_generation_prompt else [])]


def test_answer_header_is_what_the_template_adds_to_open_the_answer() -> None:
    assert answer_header(ChatTokenizer()) == HEADER
    # no chat template (a raw-prompt model): no header
    plain: Any = type("Plain", (), {"chat_template": None})()
    assert answer_header(plain) == []


def chain_after_first_token(header: list[int]) -> list[list[int]]:
    """The first decode step's draft (context: the prompt and the answer's first token), budget 4."""
    trie = TokenTrie()
    fill_trie(trie, [PastOutput(ANSWER, 1, True), PastOutput([50, 51, 52], 1, False)], PROMPT, header)
    return retrieve_draft(trie, [*PROMPT, ANSWER[0]], DecodingConfig(), budget=4, max_depth=100,
                          chain_to=100).paths()


def test_a_repeated_answer_is_one_chain_from_the_first_decode_step() -> None:
    # after the header, the context's last 4 tokens (header + first token) match: the whole rest is drafted
    assert chain_after_first_token(HEADER) == [ANSWER[1:]]
    # inserted as it is (no header): the first token alone matches, too short to copy past the budget
    assert all(len(path) <= 4 for path in chain_after_first_token([]))


def test_fragments_and_raw_prompts_get_no_header() -> None:
    trie = TokenTrie()
    fill_trie(trie, [PastOutput([50, 51, 52], 1, False)], PROMPT, HEADER)
    assert trie.find([*HEADER, 50]) is None and trie.find([50, 51, 52]) is not None  # a fragment as it is
    raw = TokenTrie()
    fill_trie(raw, [PastOutput(ANSWER, 1, True)], [1, 2, 3], HEADER)  # a raw prompt does not end with it
    assert raw.find([*HEADER, 10]) is None and raw.find(ANSWER[:5]) is not None
