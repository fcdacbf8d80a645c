"""A past answer as the prompt may show it: cut where the model ran on past its own answer.

A stored answer is the model's text up to where decoding stopped; a small model often runs on past its
answer into a new turn ("...\\n\\nQuestion: Who is ...", "<|im_start|>user", "Q: ... A: ..."). Shown
to a later prompt, that tail reads as a document or a turn to continue, and the model replays it.
``cut_answer`` keeps the text before the first such marker (and before the model's own end-of-turn
tokens, when they were decoded as text). Pure: no model, no tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A new turn or block begins: a question or answer label at a line start, or the prompt's own headers.
_RUNAWAY = re.compile(
    r"(?:^|\n)\s*(?:Question|Q|Answer|A|User|Assistant|Documents|Past answers[^\n]*)\s*:|(?:^|\n)\s*\[\d+\]\s",
    re.IGNORECASE,
)
END_OF_TURN = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>", "</s>")  # as decoded text


def cut_answer(answer: str, special_tokens: Sequence[str] = ()) -> str:
    """``answer`` up to the first end-of-turn token or runaway turn marker, stripped."""
    end = len(answer)
    for token in (*END_OF_TURN, *special_tokens):
        at = answer.find(token) if token else -1
        if at >= 0:
            end = min(end, at)
    text = answer[:end]
    m = _RUNAWAY.search(text)
    if m is not None and m.start() == 0:  # a label at the very start is the answer's own ("A: Paris"): kept
        m = _RUNAWAY.search(text, m.end())
    return (text[: m.start()] if m is not None else text).strip()
