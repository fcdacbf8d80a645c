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

import logging

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

# transformers imports torchao (a dependency: weight-only int8/int4 off the CPU) when it is installed; under the
# CPU build of torch its CUDA extension libraries fail to load, one warning each, and its enums trip a
# deprecation line of torch's pytree at registration. None of it concerns the configs used here (plain torch
# ops on a CPU; the tinygemm kernels load on CUDA): kept to errors.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
for _name in QUIET_LOGGERS:
    logging.getLogger(_name).setLevel(logging.ERROR)


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
