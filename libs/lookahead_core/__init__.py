"""lookahead_core: lossless multi-branch (lookahead) decoding for Hugging Face causal LMs.

Importing the package costs no torch: the names below (configuration, trie, drafts, verification,
stats, the step observer, model defaults) are torch-free, so light users such as the draft cache's
trie stay light. Torch users import from the submodules explicitly:

    from lookahead_core.engine.decoder import LookaheadDecoder  # the engine at one request (batch-1 API)
    from lookahead_core.models import load_model             # model + tokenizer, built-ins cached
    from lookahead_core.engine.scheduler import StepScheduler       # the serving engine
    from lookahead_core.sampling import TokenChooser, generate_sampled  # seeded lossless sampling
"""

from __future__ import annotations

from .config import DecodingConfig, DraftMode, TrieConfig
from .defaults import DEFAULT_MODEL, cache_dir
from .drafting.draft import Drafter, DraftTree
from .drafting.trie import TokenTrie
from .drafting.verify import accept_longest
from .observer import PathRecorder, StepObserver
from .proposers.trie import retrieve_draft
from .stats import DecodeStats
from .vocab import tokenizer_id

__all__ = [
    "DEFAULT_MODEL",
    "DecodeStats",
    "DecodingConfig",
    "DraftMode",
    "DraftTree",
    "Drafter",
    "PathRecorder",
    "StepObserver",
    "TokenTrie",
    "TrieConfig",
    "accept_longest",
    "cache_dir",
    "retrieve_draft",
    "tokenizer_id",
]
