"""IncrementalDetokenizer with the real SmolLM2 tokenizer: deltas concatenate to a full decode, whole characters."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_core.detok import REPLACEMENT, IncrementalDetokenizer
from lookahead_core.models import load_tokenizer
from transformers import PreTrainedTokenizerBase


@functools.cache
def tok() -> PreTrainedTokenizerBase:
    return load_tokenizer()


def stream(ids: list[int], sizes: list[int], skip_special_tokens: bool = True) -> list[str]:
    """Push ``ids`` in chunks of ``sizes`` (cycled), then flush; every delta in order."""
    detok = IncrementalDetokenizer(tok(), skip_special_tokens=skip_special_tokens)
    out, at, k = [], 0, 0
    while at < len(ids):
        size = sizes[k % len(sizes)]
        out.append(detok.push(ids[at : at + size]))
        at, k = at + size, k + 1
    out.append(detok.flush())
    return out


TEXTS = [
    # mixed scripts: Latin accents, CJK, emoji (4-byte UTF-8 split over several byte tokens)
    "naïve 東京 🙂 café",
    # a family emoji: code points joined by zero-width joiners, each split into byte tokens
    "family: 👨\u200d👩\u200d👧 done",
    # words whose leading space belongs to the token: a lone decode would lose it
    "The quick brown fox jumps over the lazy dog.",
    # code with indentation runs and newlines
    "def f(x):\n    return {'a': [x, x ** 2]}\n",
    # accents and symbols next to punctuation
    "Ω≈ç√ – “quoted” — «guillemets» … 10€",
    # a long run of CJK with no spaces
    "吾輩は猫である。名前はまだ無い。",
]


@pytest.mark.parametrize("sizes", [[1], [2], [3], [1, 4, 2], [100]], ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(text: str, sizes: list[int]) -> None:
    ids = tok().encode(text)
    deltas = stream(ids, sizes)
    assert "".join(deltas) == tok().decode(ids, skip_special_tokens=True) == text
    for delta in deltas:
        assert REPLACEMENT not in delta  # never half a character


def test_multibyte_characters_are_held_until_complete() -> None:
    ids = tok().encode("🙂")
    assert len(ids) > 1  # the emoji really is several byte tokens
    detok = IncrementalDetokenizer(tok())
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "🙂"
    assert detok.flush() == ""


def test_special_tokens_are_skipped_or_kept() -> None:
    text_ids = tok().encode("hello world")
    ids = [1, *text_ids, 2]  # <|im_start|> ... <|im_end|>
    assert "".join(stream(ids, [1])) == "hello world"
    assert "".join(stream(ids, [1], skip_special_tokens=False)) == tok().decode(ids, skip_special_tokens=False)


def test_incomplete_character_at_the_end_is_flushed() -> None:
    ids = tok().encode("ok 🙂")[:-1]  # cut inside the emoji's bytes
    deltas = stream(ids, [1])
    assert "".join(deltas) == tok().decode(ids)
    assert REPLACEMENT not in "".join(deltas[:-1])  # only flush shows the broken tail


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(st.characters(codec="utf-8", exclude_characters=REPLACEMENT), max_size=40),
    seed=st.integers(0, 2**16),
)
def test_any_text_any_chunking(text: str, seed: int) -> None:
    ids = tok().encode(text)
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in range(8)]
    deltas = stream(ids, sizes)
    full = tok().decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == full
    if REPLACEMENT not in full:
        assert not any(REPLACEMENT in d for d in deltas)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 48_000), max_size=30), seed=st.integers(0, 2**16))
def test_arbitrary_token_sequences(ids: list[int], seed: int) -> None:
    """Random ids (lone UTF-8 bytes, special tokens): deltas still concatenate to the full decode."""
    rng = random.Random(seed)
    deltas = stream(ids, [rng.randint(1, 4) for _ in range(8)])
    assert "".join(deltas) == tok().decode(ids, skip_special_tokens=True)


class SentencePieceLike:
    """Decodes like SentencePiece: '▁' is a space and the text's leading space is dropped."""

    PIECES = ("▁Hello", "▁world", "!", "▁it", "'s", "▁me", "▁again")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.PIECES[i] for i in ids).replace("▁", " ").removeprefix(" ")


@pytest.mark.parametrize("sizes", [[1], [2], [1, 3]], ids=["one", "two", "mixed"])
def test_leading_spaces_survive_tokenizers_that_drop_them_alone(sizes: list[int]) -> None:
    """A token decoded on its own loses its leading space there: deltas must come from a wider window."""
    fake = SentencePieceLike()
    ids = list(range(len(fake.PIECES)))
    detok = IncrementalDetokenizer(fake)  # type: ignore[arg-type]
    deltas, at, k = [], 0, 0
    while at < len(ids):
        deltas.append(detok.push(ids[at : at + sizes[k % len(sizes)]]))
        at, k = at + sizes[k % len(sizes)], k + 1
    deltas.append(detok.flush())
    assert "".join(deltas) == fake.decode(ids) == "Hello world! it's me again"
