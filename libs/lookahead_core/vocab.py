"""A tokenizer's vocabulary id: caches keyed by it never mix token spaces (no torch needed)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tokenizer_id(tokenizer: PreTrainedTokenizerBase) -> str:
    """A stable id of a tokenizer's vocabulary: caches keyed by it never mix token spaces."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha1()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        digest.update(f"{idx}\t{token}\n".encode())
    return f"{type(tokenizer).__name__.removesuffix('Fast').lower()}-{len(vocab)}-{digest.hexdigest()[:12]}"
