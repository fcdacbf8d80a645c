"""trim_step: a step's verified tokens end at the first EOS / length / stop-string event, whatever the step size.

Pure cases use a fake vocabulary (token id -> a short string); one end-to-end case checks
LookaheadDecoder against transformers' ``generate(stop_strings=...)`` on a tiny random llama
that uses the real SmolLM2 vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_core import DecodingConfig, Drafter, DraftMode
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.engine.finish import FinishReason, stop_lookback, trim_step

from tests.core.helpers import eos_as, greedy, oracle_drafter, text_model, tok

# ---- pure cases ----------------------------------------------------------------------------------
LETTERS = "abcdefghij"  # token i < 10 decodes to LETTERS[i]
EOS = 99  # decodes to "" (a skipped special token)
WORDS = ["a", "b", "c", "ab", "ba", "abc", "cab"]  # multi-character vocabulary of the property tests


def ids(text: str) -> list[int]:
    """One token per letter."""
    return [LETTERS.index(ch) for ch in text]


def decode(tokens: list[int]) -> str:
    return "".join(LETTERS[t] for t in tokens if t != EOS)


def decode_words(tokens: list[int]) -> str:
    return "".join(WORDS[t] for t in tokens if t < len(WORDS))  # EOS_WORD decodes to ""


class Case(NamedTuple):
    output: str  # tokens already emitted (one per letter)
    new: list[int]  # the step's verified tokens
    max_new: int  # max_new_tokens
    stops: tuple[str, ...]  # stop strings
    want: list[int]  # tokens kept
    reason: FinishReason  # finish reason


CASES: dict[str, Case] = {
    # nothing ends the run: the whole step is kept
    "no-event": Case("ab", ids("cd"), 10, ("x",), ids("cd"), ""),
    # EOS in the middle of a step: kept, the rest dropped
    "eos": Case("ab", [*ids("c"), EOS, *ids("d")], 10, (), [*ids("c"), EOS], "eos"),
    # the length limit falls inside the step
    "length": Case("ab", ids("cdef"), 4, (), ids("cd"), "length"),
    # a stop string completes inside the step: kept up to the token completing it
    "stop": Case("ab", ids("cdef"), 10, ("de",), ids("cde"), "stop"),
    # a stop string spans the earlier output and the step
    "stop-across-steps": Case("abc", ids("def"), 10, ("cd",), ids("d"), "stop"),
    # the old bug: a stop string, then EOS, in one step -> "stop", EOS and the tokens before it dropped
    "stop-then-eos": Case("a", [*ids("bc"), *ids("d"), EOS], 10, ("bc",), ids("bc"), "stop"),
    # the old bug: a stop string, then the length limit, in one step -> "stop" at the stop string
    "stop-then-length": Case("a", ids("bcdef"), 5, ("bc",), ids("bc"), "stop"),
    # EOS before a stop string in the same step: EOS wins
    "eos-then-stop": Case("a", [*ids("b"), EOS, *ids("cd")], 10, ("cd",), [*ids("b"), EOS], "eos"),
    # the token that completes a stop string is also the last allowed one: "stop"
    "stop-at-length": Case("ab", ids("cde"), 4, ("cd",), ids("cd"), "stop"),
    # EOS as the last allowed token: "eos"
    "eos-at-length": Case("ab", [*ids("c"), EOS, *ids("d")], 4, (), [*ids("c"), EOS], "eos"),
    # of two stop strings the one completing first wins, not the one listed first
    "two-stops": Case("", ids("abcdef"), 10, ("ef", "bc"), ids("abc"), "stop"),
    # an empty stop string is ignored (it would match everywhere)
    "empty-stop": Case("ab", ids("cd"), 10, ("",), ids("cd"), ""),
    # a stop string already in the earlier text is not new: it does not end this step
    "old-stop": Case("bcd", ids("e"), 10, ("cd",), ids("e"), ""),
    # the output is already at the limit: nothing more is kept
    "already-full": Case("ab", ids("c"), 2, (), [], "length"),
    # an empty step stays unfinished
    "empty-step": Case("ab", [], 10, ("b",), [], ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trim_step_cases(name: str) -> None:
    c = CASES[name]
    got = trim_step(ids(c.output), c.new, frozenset({EOS}), c.max_new, c.stops, decode)
    assert got == (c.want, c.reason)


def test_only_a_bounded_tail_is_decoded() -> None:
    # a long output: each decode covers at most the lookback plus the step, and the stop is still found
    output = ids("abcdefghij" * 100)
    new = ids("aab")
    seen: list[int] = []

    def counting(tokens: list[int]) -> str:
        seen.append(len(tokens))
        return decode(tokens)

    got = trim_step(output, new, frozenset({EOS}), 10_000, ("jaa",), counting)
    assert got == (ids("aa"), "stop")
    assert max(seen) <= stop_lookback(("jaa",)) + len(new)


# ---- step-size invariance ------------------------------------------------------------------------
def one_by_one(
    tokens: Sequence[int], max_new: int, stops: Sequence[str], eos: frozenset[int]
) -> tuple[list[int], FinishReason]:
    """Oracle: generate token by token, decoding the whole output each time."""
    out: list[int] = []
    for token in tokens:
        before = decode_words(out)
        out.append(token)
        text = decode_words(out)
        if token in eos:
            return out, "eos"
        if any(s and s in text and s not in before for s in stops):
            return out, "stop"
        if len(out) >= max_new:
            return out, "length"
    return out, ""


def in_steps(
    tokens: Sequence[int], sizes: Sequence[int], max_new: int, stops: Sequence[str], eos: frozenset[int]
) -> tuple[list[int], FinishReason]:
    """Feed ``tokens`` through trim_step in steps of the given sizes (cycled) until a finish."""
    out: list[int] = []
    pos, k = 0, 0
    while pos < len(tokens):
        step = tokens[pos : pos + sizes[k % len(sizes)]]
        pos, k = pos + len(step), k + 1
        kept, reason = trim_step(out, step, eos, max_new, stops, decode_words)
        out.extend(kept)
        if reason:
            return out, reason
    return out, ""


EOS_WORD = len(WORDS)  # EOS of the property tests (decodes to "")


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, EOS_WORD), max_size=40),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    max_new=st.integers(1, 45),
    stops=st.lists(st.text("abc", max_size=4), max_size=3),
)
def test_step_size_does_not_change_the_result(
    tokens: list[int], sizes: list[int], max_new: int, stops: list[str]
) -> None:
    # any split of the same token sequence into steps gives the token-by-token result (ids and reason)
    eos = frozenset({EOS_WORD})
    assert in_steps(tokens, sizes, max_new, stops, eos) == one_by_one(tokens, max_new, stops, eos)


# ---- against transformers' generate(stop_strings=...) --------------------------------------------
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
FREE_NEW = 24  # greedy tokens looked at to pick stop strings
STOP_AT = 5  # the stop string completes at this output token (inside the second step)


@functools.cache
def reference() -> tuple[list[int], list[int]]:
    """(prompt ids, fixed-length greedy output ids without EOS)."""
    prompt = tok().encode(PROMPT)
    with eos_as(text_model(), None):
        return prompt, greedy(text_model(), prompt, FREE_NEW)


def piece(out: list[int], i: int) -> str:
    """Text of output token i as it reads inside the whole text."""
    text = functools.partial(tok().decode, skip_special_tokens=True)
    return text(out[: i + 1])[len(text(out[:i])) :]


def stop_string() -> str:
    """The last two characters of token STOP_AT - 1 plus token STOP_AT: first completed by token STOP_AT."""
    _, out = reference()
    s = (piece(out, STOP_AT - 1)[-2:] + piece(out, STOP_AT)).strip() or piece(out, STOP_AT)
    full = tok().decode(out, skip_special_tokens=True)
    assert full.find(s) + len(s) == len(tok().decode(out[: STOP_AT + 1], skip_special_tokens=True)), s
    return s


def hf_generate(prompt: list[int], max_new: int, stops: list[str], eos: int | None) -> list[int]:
    """transformers greedy with stop strings: the reference."""
    model = text_model()
    x = torch.tensor([prompt], dtype=torch.long)  # [1, prompt]
    with eos_as(model, eos), torch.inference_mode():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=max_new,
            stop_strings=stops,
            tokenizer=tok(),
            pad_token_id=0,
        )  # out: [1, prompt + new]
    return out[0, len(prompt) :].tolist()


def first_new_token_after(out: list[int], start: int) -> int:
    """An output position >= start whose token does not occur earlier (usable as EOS there)."""
    return next(j for j in range(start, len(out)) if out[j] not in out[:j])


# what follows the stop string inside the same (big) step
TAILS = ("eos", "length", "nothing")


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("drafting", ["oracle", "none"])
def test_stop_string_matches_transformers(tail: str, drafting: str) -> None:
    # a stop string completes at output token STOP_AT; the same step (oracle drafter: one step holds
    # every token after the first) then reaches EOS or the length limit; ids and reason must be those
    # of transformers' generate(stop_strings=...), and the same one token per step
    prompt, out = reference()
    stops = [stop_string()]
    eos = out[first_new_token_after(out, STOP_AT + 2)] if tail == "eos" else None
    max_new = STOP_AT + 3 if tail == "length" else 2 * FREE_NEW  # 2x: the oracle's step ends before the limit
    want = hf_generate(prompt, max_new, stops, eos)
    assert want == out[: STOP_AT + 1]  # transformers stops at the stop string too
    config = DecodingConfig(max_new_tokens=max_new, stop_strings=tuple(stops), decoding_length=FREE_NEW)
    drafter: Drafter | None = oracle_drafter(len(prompt), out) if drafting == "oracle" else None
    if drafting == "none":
        config = replace(config, mode=DraftMode.NONE)
    with eos_as(text_model(), eos):
        dec = LookaheadDecoder(text_model(), tok(), config)
        res = dec.generate(prompt, drafter=drafter)
    assert res.output_ids == want
    assert res.stats.finish_reason == "stop"
    assert res.text == tok().decode(want, skip_special_tokens=True).split(stops[0])[0]
    if drafting == "oracle":
        assert res.stats.accepted_per_step == [STOP_AT]  # the stop really fell inside one step
