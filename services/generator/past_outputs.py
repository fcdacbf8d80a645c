"""The tenant's past outputs in a request's trie: fragments as fetched, whole answers after the answer header.

The draft cache returns whole past answers (the most similar first) and chained fragments. Inserted as
they are, an answer's first tokens follow nothing: at the first decode step the context ends
``<|im_start|>assistant\\n`` + the first token, which matches an answer's first token alone, too short
a match to copy from (``extend_min_match``), so even a repeated answer is drafted 8 nodes at a time
until its own output makes the match long. Inserted after the chat template's answer header (the
tokens every chat prompt ends with), the n-grams across the prompt/answer boundary exist and a
repeated answer is copied as one chain from the first decode step on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from lookahead_core.drafting.trie import TokenTrie

PROBE = [{"role": "user", "content": "?"}]  # any one message: the header is what the template adds after it


class PastOutput(NamedTuple):
    """One fetched continuation, as the request's trie takes it."""

    ids: list[int]  # its tokens
    count: int  # its occurrence count (trie weight)
    whole: bool  # a whole past answer (not a fragment)


def answer_header(tokenizer: Any) -> list[int]:
    """The tokens a chat template adds to open the assistant's answer (its generation prompt); [] for a
    tokenizer without a chat template, or one whose generation prompt is not a plain suffix."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    def ids(add: bool) -> list[int]:
        out = tokenizer.apply_chat_template(PROBE, add_generation_prompt=add, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)  # a BatchEncoding in newer versions
    bare, opened = ids(False), ids(True)
    return opened[len(bare):] if opened[: len(bare)] == bare else []


def fill_trie(trie: TokenTrie, outputs: Sequence[PastOutput], prompt_ids: Sequence[int], header: Sequence[int]) -> None:
    """Insert the fetched outputs; whole answers after ``header`` when the prompt ends with it (a chat
    prompt): a raw prompt gets them as they are."""
    lead = list(header) if header and list(prompt_ids[-len(header):]) == list(header) else []
    for out in outputs:
        trie.insert_output([*lead, *out.ids] if out.whole else out.ids, count=out.count, prune=False)
