"""The decoder's kernels: a tree-forward probe and one calibrated KernelSet per model and process.

    kernels = decoder_kernels(model)          # "auto": stock and packed twins, timed once per process
    kernels = decoder_kernels(model, "stock") # one kernel forced (tests cover both paths this way)
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from .attention import tree_attention
from .draft import DraftTree
from .kernels import KERNELS, KernelSet
from .kvcache import rollback_cache
from .tree_inputs import TreeInputs, build_tree_inputs

log = logging.getLogger(__name__)

AUTO = "auto"  # measure every kernel and pick per forward size
CHOICES = (AUTO, *KERNELS)  # what LookaheadDecoder(kernels=...) accepts as a string
FORK_EVERY = 4  # probe trees fork at every 4th node (the shape barely changes the cost; the size does)


@dataclass(frozen=True)
class CalibrationConfig:
    """How the decoder times its kernels at start-up."""

    cache_tokens: int = 256  # cached tokens the probe forwards attend to (a grounded prompt + part of an answer)
    token_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # forward sizes timed (root + drafts)
    repeats: int = 3  # timed forwards per kernel and size; the median is kept
    warmup: int = 1  # untimed rounds first (allocator, oneDNN primitive caches)
    seed: int = 0  # seed of the random prompt and tree tokens


CALIBRATION = CalibrationConfig()  # the decoder's default


def probe_tree(n_tokens: int, vocab: int, generator: torch.Generator) -> DraftTree:
    """A draft tree of ``n_tokens - 1`` nodes (plus the root: n tokens): a chain forking every 4th node.

    Example: n_tokens 6 -> parents (0, 1, 2, 3, 0): nodes 1-4 a chain, node 5 a second child of the root.
    """
    tree = DraftTree()
    for i in range(n_tokens - 1):
        token = int(torch.randint(0, vocab, (1,), generator=generator))
        tree.add(0 if i % FORK_EVERY == 0 else len(tree), token, merge=False)
    return tree


class TreeProbe:
    """``probe(module, n)``: one verification forward of an n-token tree over ``cache_tokens`` cached tokens.

    The cache is filled by the first module probed (twins share the weights, so every twin would
    fill it alike) and cut back after each forward; inputs are built once per size, so only the
    forward is timed. Pass it to ``KernelSet.calibrate``.
    """

    def __init__(self, cache_tokens: int, seed: int = 0) -> None:
        if cache_tokens < 1:
            raise ValueError("cache_tokens must be >= 1")
        self.cache_tokens = cache_tokens
        self._gen = torch.Generator().manual_seed(seed)
        self._cache: DynamicCache | None = None
        self._inputs: dict[int, TreeInputs] = {}

    def __call__(self, module: nn.Module, n_tokens: int) -> None:
        param = next(module.parameters())
        vocab = int(module.config.vocab_size)
        with torch.inference_mode():
            if self._cache is None:
                prompt = torch.randint(0, vocab, (1, self.cache_tokens), generator=self._gen)  # [1, past]
                self._cache = DynamicCache()
                module(input_ids=prompt.to(param.device), past_key_values=self._cache, use_cache=True,
                       logits_to_keep=1)
            if n_tokens not in self._inputs:
                tree = probe_tree(n_tokens, vocab, self._gen)
                self._inputs[n_tokens] = build_tree_inputs(tree, 0, self.cache_tokens, param.dtype, param.device)
            inputs = self._inputs[n_tokens]
            try:
                module(
                    input_ids=inputs.input_ids,  # [1, n]
                    position_ids=inputs.position_ids,  # [1, n]
                    attention_mask=inputs.attention_mask,  # [1, 1, n, past + n]
                    past_key_values=self._cache,
                    use_cache=True,
                )
            finally:
                rollback_cache(self._cache, self.cache_tokens)


def build_decoder_kernels(model: nn.Module, choice: str = AUTO, config: CalibrationConfig = CALIBRATION) -> KernelSet:
    """A KernelSet with the decoder's attention (TREE_SDPA for sdpa models); "auto" calibrates it."""
    if choice not in CHOICES:
        raise ValueError(f"kernels must be one of {CHOICES} or a KernelSet, not {choice!r}")
    kernels = KernelSet(model, tree_attention(model), KERNELS if choice == AUTO else (choice,))
    if len(kernels.names) > 1:
        kernels.calibrate(TreeProbe(config.cache_tokens, config.seed), config.token_counts, config.repeats,
                          config.warmup)
        log.info("decoder kernels: %s", kernels.describe())
    return kernels


_SETS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, str | None], KernelSet]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def decoder_kernels(model: nn.Module, choice: str = AUTO, config: CalibrationConfig = CALIBRATION) -> KernelSet:
    """``build_decoder_kernels`` once per model, choice and attention in this process (later calls reuse it,
    whatever ``config`` they pass): every decoder over one model shares the twins and one calibration."""
    key = (choice, getattr(model.config, "_attn_implementation", None))
    with _LOCK:
        sets = _SETS.setdefault(model, {})
        if key not in sets:
            sets[key] = build_decoder_kernels(model, choice, config)
        return sets[key]
