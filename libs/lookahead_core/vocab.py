"""A tokenizer's vocabulary id: caches keyed by it never mix token spaces (no torch needed)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# what ``tokenizer_id`` makes: "<class>-<vocabulary size>-<12 hex digits of the vocabulary's digest>"
_ID_FORM = re.compile(r"^[a-z0-9_]+-(?P<size>[0-9]{1,9})-[0-9a-f]{12}$")


def tokenizer_id(tokenizer: PreTrainedTokenizerBase) -> str:
    """A stable id of a tokenizer's vocabulary: caches keyed by it never mix token spaces."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha1()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        digest.update(f"{idx}\t{token}\n".encode())
    return f"{type(tokenizer).__name__.removesuffix('Fast').lower()}-{len(vocab)}-{digest.hexdigest()[:12]}"


def vocab_size_of(tokenizer_id_: str) -> int | None:
    """The vocabulary size a ``tokenizer_id`` names (token ids are below it); None for an id of another
    form (a test's or a caller's own name), which names no vocabulary."""
    match = _ID_FORM.match(tokenizer_id_)
    return int(match["size"]) if match else None


def out_of_vocab(ids: Sequence[int], vocab_size: int) -> int | None:
    """The first id that is not below ``vocab_size`` (or is negative), or None when every one is."""
    return next((t for t in ids if not 0 <= t < vocab_size), None)


def check_in_vocab(ids: Sequence[int], vocab_size: int, what: str = "token",
                   error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first of ``ids`` (``what`` ids: "prompt token", ...) not in [0, vocab_size):
    the engine checks a prompt with it before it runs, a service each id a caller sends."""
    bad = out_of_vocab(ids, vocab_size)
    if bad is not None:
        raise error(f"{what} id {bad} is out of the vocabulary (size {vocab_size})")
