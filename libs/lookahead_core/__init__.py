"""lookahead_core: lossless multi-branch (lookahead) decoding for Hugging Face causal LMs.

Importing the package costs no torch: the names below (configuration, trie, drafts, verification,
stats, the step observer, model defaults) are torch-free, so light users such as the draft cache's
trie stay light. A server imports the engine from its face, ``lookahead_core.serving`` (torch); other
torch users import from the submodules explicitly:

    from lookahead_core.serving import StepScheduler, ServeRequest   # the serving engine and its ticket
    from lookahead_core.engine.decoder import LookaheadDecoder  # the engine at one request (batch-1 API)
    from lookahead_core.models import load_model             # model + tokenizer, built-ins cached
    from lookahead_core.sampling import TokenChooser, generate_sampled  # seeded lossless sampling
"""

from __future__ import annotations

from .config import LOSSY_MODES, MJSD_BEAMS, MJSD_THRESHOLD, DecodingConfig, DraftMode, TrieConfig, parse_mode
from .defaults import DEFAULT_MODEL, cache_dir
from .detok import TextStreamer
from .drafting.draft import Drafter, DraftTree
from .drafting.trie import TokenTrie
from .drafting.verify import accept_longest
from .observer import PathRecorder, StepObserver
from .proposers.trie import retrieve_draft
from .stats import DecodeStats
from .vocab import check_in_vocab, out_of_vocab, tokenizer_id

__all__ = [
    "DEFAULT_MODEL",
    "LOSSY_MODES",
    "MJSD_BEAMS",
    "MJSD_THRESHOLD",
    "DecodeStats",
    "DecodingConfig",
    "DraftMode",
    "DraftTree",
    "Drafter",
    "PathRecorder",
    "StepObserver",
    "TextStreamer",
    "TokenTrie",
    "TrieConfig",
    "accept_longest",
    "cache_dir",
    "check_in_vocab",
    "out_of_vocab",
    "parse_mode",
    "retrieve_draft",
    "tokenizer_id",
]
