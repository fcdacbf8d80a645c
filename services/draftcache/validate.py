"""Input checks of the draft cache: each bad input raises InvalidArgument with a one-line message."""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_rag.services.common.errors import InvalidArgument

MAX_TOKEN_ID = 2**31 - 1  # token ids are non-negative and fit a signed 32-bit int (every real vocabulary)


def check_name(kind: str, value: str, max_chars: int) -> str:
    """A non-empty, not over-long name (tenant, tokenizer id, event id)."""
    if not value:
        raise InvalidArgument(f"{kind} must not be empty")
    if len(value) > max_chars:
        raise InvalidArgument(f"{kind} is {len(value)} characters; at most {max_chars}")
    return value


def check_ids(kind: str, ids: Sequence[int], max_count: int, vocab_size: int | None = None) -> list[int]:
    """At most ``max_count`` token ids, each in [0, vocab_size) (a vocabulary known: the tokenizer id
    names it) or [0, MAX_TOKEN_ID]; returned as a list of ints."""
    if len(ids) > max_count:
        raise InvalidArgument(f"{kind} has {len(ids)} ids; at most {max_count}")
    top = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    out = [int(t) for t in ids]
    if out and (min(out) < 0 or max(out) > top):
        index, bad = next((i, t) for i, t in enumerate(out) if not 0 <= t <= top)
        raise InvalidArgument(f"{kind}[{index}] = {bad} is not a token id of this tokenizer (0..{top})")
    return out


def check_budget(budget: int, default: int, maximum: int) -> int:
    """The token budget of a Fetch: 0 means ``default``; negative or over ``maximum`` is refused."""
    if budget == 0:
        return default
    if budget < 0 or budget > maximum:
        raise InvalidArgument(f"budget {budget} is out of range (1..{maximum}, 0 = default {default})")
    return budget
