"""Lossless sampling, in one import (torch): keyed noise, processors, the chooser and the reference.

    from lookahead_core.sampling import TokenChooser, generate_sampled, keyed_gumbel

- ``keyed_gumbel(seed, position, vocab)`` (gumbel.py): the noise of one output position.
- ``build_processors(generation_config, config, prompt_len)`` (processors.py): generate's processors.
- ``TokenChooser`` (chooser.py): a request's choice after every node of a step's tree;
  ``resolve_seed(config)``: the seed a run uses (random when sampling without one).
- ``generate_sampled(model, tokenizer, prompt_ids, config)`` (reference.py): one token per forward,
  the output every lookahead run with the same seed equals.
"""

from __future__ import annotations

from .chooser import TokenChooser, resolve_seed
from .gumbel import GumbelCache, keyed_gumbel
from .processors import UnsupportedGenerationConfig, build_processors, merged_generation_config
from .reference import generate_sampled

__all__ = [
    "GumbelCache",
    "TokenChooser",
    "UnsupportedGenerationConfig",
    "build_processors",
    "generate_sampled",
    "keyed_gumbel",
    "merged_generation_config",
    "resolve_seed",
]
