"""lookahead_core: lossless multi-branch (lookahead) decoding for Hugging Face causal LMs."""

from .config import DecodingConfig, DraftMode, TrieConfig
from .decoder import GenerationResult, GenerationStats, LookaheadDecoder
from .draft import DraftTree, retrieve_draft
from .kvcache import compact_cache, rollback_cache
from .models import DEFAULT_MODEL, load_model, load_tokenizer, tokenizer_id
from .trie import TokenTrie
from .verify import accept_longest

__all__ = [
    "DEFAULT_MODEL",
    "DecodingConfig",
    "DraftMode",
    "DraftTree",
    "GenerationResult",
    "GenerationStats",
    "LookaheadDecoder",
    "TokenTrie",
    "TrieConfig",
    "accept_longest",
    "compact_cache",
    "load_model",
    "load_tokenizer",
    "retrieve_draft",
    "rollback_cache",
    "tokenizer_id",
]
