"""A model's context window: a prompt and its answer must fit in it. The one arithmetic every service uses.

    context_room(8192, 8000)       # -> 192: tokens left after 8000 (a prompt's, or an answer's reserved)
    context_room(0, 8000)          # -> None: the context is unknown, nothing is bounded
    check_fits(8000, 256, 8192)    # InvalidArgument: prompt of 8000 tokens + max_new_tokens 256 does not fit ...
"""

from __future__ import annotations

from lookahead_rag.services.common.errors import InvalidArgument


def context_room(context_tokens: int, used: int) -> int | None:
    """Tokens of a ``context_tokens`` window left once ``used`` are taken (negative: over it); None when the
    window is unknown (0)."""
    return context_tokens - used if context_tokens else None


def check_fits(prompt_tokens: int, max_new_tokens: int, context_tokens: int) -> None:
    """Refuse (InvalidArgument) a prompt whose answer of ``max_new_tokens`` would run past the context."""
    room = context_room(context_tokens, prompt_tokens)
    if room is not None and max_new_tokens > room:
        raise InvalidArgument(
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} does not fit "
            f"the model's context of {context_tokens}"
        )
