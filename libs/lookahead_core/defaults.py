"""Names and paths that need no torch: the default model's name and the cache directory (catalog.py: all built-ins).

Settings, the draft cache and the retriever read these without importing torch or transformers;
``models.py`` (which loads models) builds on them.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"  # the built-in model served when none is named
CACHE_ENV = "LOOKAHEAD_RAG_CACHE"  # environment variable that moves the cache directory


def cache_dir() -> Path:
    """Where converted models (and the services' data) live: $LOOKAHEAD_RAG_CACHE or ~/.cache/lookahead-rag."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lookahead-rag"
    return Path(root)
