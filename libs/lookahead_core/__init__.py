"""lookahead_core: lossless multi-branch (lookahead) decoding for Hugging Face causal LMs.

Names are imported lazily, so light users (the draft cache's trie) do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DecodingConfig": "config", "DraftMode": "config", "TrieConfig": "config",
    "GenerationResult": "decoder", "GenerationStats": "decoder", "LookaheadDecoder": "decoder",
    "DraftTree": "draft", "retrieve_draft": "draft",
    "CostCurve": "kernels", "KernelSet": "kernels",
    "compact_cache": "kvcache", "rollback_cache": "kvcache",
    "DEFAULT_MODEL": "models", "load_model": "models", "load_tokenizer": "models", "tokenizer_id": "models",
    "TokenTrie": "trie",
    "accept_longest": "verify",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lookahead_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
