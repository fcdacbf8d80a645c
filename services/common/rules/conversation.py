"""A RAG answer's conversation: the messages before its question, checked, cut into turns, and the
rule for what a follow-up question is searched with. Pure functions (no tokenizer, no model): the
retriever builds the prompt with them, the generator its no-documents fallback, both doors check
the same way.

    check_history(history, limits)                  # roles and size; InvalidArgument with one line
    system, turns = split_turns(history)            # the conversation's system texts, its turns in order
    retrieval_query("and what about it?", history, max_words=4)  # -> "<previous user turn>\\n<question>"
    kept = newest_that_fit(lambda n: fits(turns[len(turns) - n:]), len(turns))

A turn is one user message with the assistant messages after it (assistant messages before the
first user message are a turn of their own): the history is cut oldest turn first, whole turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits

# the roles a history message may have -> the chat template's role ("developer": OpenAI's newer "system")
HISTORY_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# first words that make a question lean on the one before it ("and what about it?", "does that work?")
LEANING_WORDS = frozenset({
    "and", "but", "also", "so", "then", "or", "what about", "how about",
    "it", "it's", "its", "that", "that's", "this", "these", "those", "they", "them", "their",
    "he", "she", "his", "her", "him", "same",
})
ELLIPSES = ("...", "…")  # a question opening with one continues the one before
QUERY_SEP = "\n"  # between the previous user turn and the question in a follow-up's retrieval query
PUNCTUATION = "?!.,;:\"'()"  # stripped from a question's words before they are compared


class Message(Protocol):
    """A chat message: the domain's ChatMessage, a protobuf ChatMessage, ... (read only)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


Turn = tuple[tuple[str, str], ...]  # (template role, text) of one user message and the replies after it


def check_history(history: Sequence[Message], limits: RequestLimits) -> None:
    """Refuse (InvalidArgument) a history that with its question is more than ``[limits] max_messages``
    messages (checked first: nothing is walked past it), one with a role other than system / developer /
    user / assistant, or more characters than ``[limits] max_prompt_chars``."""
    limits.check_messages("history", len(history) + 1)  # + the question
    for n, message in enumerate(history):
        if message.role not in HISTORY_ROLES:
            raise InvalidArgument(f"history message {n}: role {message.role!r} is not allowed "
                                  f"(system, developer, user or assistant)")
    limits.check_prompt_chars("history", sum(len(m.content) for m in history))


def split_turns(history: Sequence[Message]) -> tuple[list[str], list[Turn]]:
    """The conversation's system texts (in order) and its turns (oldest first)."""
    system: list[str] = []
    turns: list[list[tuple[str, str]]] = []
    for message in history:
        role = HISTORY_ROLES[message.role]
        if role == "system":
            system.append(message.content)
        elif role == "user" or not turns:
            turns.append([(role, message.content)])
        else:
            turns[-1].append((role, message.content))
    return system, [tuple(turn) for turn in turns]


def leans_on_earlier(question: str, max_words: int) -> bool:
    """Whether ``question`` needs the one before it to be understood: at most ``max_words`` words, or
    opening with an ellipsis or a ``LEANING_WORDS`` word ("and what about it?", "...and in Go?")."""
    text = question.strip()
    if text.startswith(ELLIPSES):
        return True
    words = [w.strip(PUNCTUATION).lower() for w in text.split()]
    words = [w for w in words if w]
    if len(words) <= max_words:
        return True
    return words[0] in LEANING_WORDS or " ".join(words[:2]) in LEANING_WORDS


def retrieval_query(question: str, history: Sequence[Message], max_words: int) -> str:
    """What the documents are searched with: the question, preceded by the previous user turn when the
    question leans on it (``leans_on_earlier``) and there is one."""
    previous = next((m.content for m in reversed(history) if HISTORY_ROLES.get(m.role) == "user"
                     and m.content.strip()), None)
    if previous is None or not leans_on_earlier(question, max_words):
        return question
    return f"{previous.strip()}{QUERY_SEP}{question.strip()}"


def newest_that_fit(fits: Callable[[int], bool], count: int) -> int:
    """The most newest turns (0..``count``) for which ``fits(n)`` holds, ``fits`` being monotone (more
    turns, a longer prompt) and ``fits(0)`` known to hold: a binary search, log2(count) calls."""
    low, high = 0, count
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low
