"""Keyed Gumbel noise: the randomness of sampling, as a pure function of (seed, output position).

Sampling draws output token t as ``argmax(processed log-probs + G(seed, t))`` (the Gumbel-max
trick: an exact draw from ``softmax(processed)``). ``G`` comes from a counter-based generator
(Philox) keyed by ``(seed, t)`` alone, so the draw for position t never depends on how many forwards
came before it, which tokens a draft proposed, or which process computes it: lookahead decoding
and plain one-token-per-forward decoding read the very same noise and so choose the very same tokens.
"""

from __future__ import annotations

import numpy as np
import torch

SEED_BITS = 64  # seeds are unsigned 64-bit (DecodingConfig.seed is in [0, 2**64))


def keyed_gumbel(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [vocab] (float32, CPU) for output ``position`` of a run keyed by ``seed``.

    Deterministic across processes and machines: Philox with key ``[seed, position]`` draws float64
    uniforms u in [0, 1); the noise is ``-log(-log(u))`` (u = 0, probability 2**-53 per token, is
    lifted to the smallest positive double so the noise stays finite).
    """
    if not 0 <= seed < 2**SEED_BITS or not 0 <= position < 2**SEED_BITS:
        raise ValueError(f"seed and position must be in [0, 2**64), got {seed}, {position}")
    key = np.array([seed, position], dtype=np.uint64)
    u = np.random.Generator(np.random.Philox(key=key)).random(vocab)  # [vocab] float64 in [0, 1)
    np.maximum(u, np.finfo(np.float64).tiny, out=u)
    noise = torch.from_numpy(u)  # [vocab] float64, shares u's memory
    return noise.log_().neg_().log_().neg_().float()  # [vocab] float32: -log(-log(u))


class GumbelCache:
    """One run's noise by position, kept on ``device`` while positions may still be asked for.

    Nodes at the same depth of a step's tree share a position, and consecutive steps overlap (a step
    at position p reads p .. p + depth; the next starts past p): each position is drawn once. Output
    positions only grow, so ``forget_before(p)`` drops what no later step can need.
    """

    def __init__(self, seed: int, vocab: int, device: torch.device | str = "cpu") -> None:
        self.seed = seed
        self.vocab = vocab
        self.device = torch.device(device)
        self._by_position: dict[int, torch.Tensor] = {}

    def __call__(self, position: int) -> torch.Tensor:
        """The noise [vocab] of ``position`` on ``device``."""
        noise = self._by_position.get(position)
        if noise is None:
            noise = keyed_gumbel(self.seed, position, self.vocab).to(self.device)
            self._by_position[position] = noise
        return noise

    def forget_before(self, position: int) -> None:
        """Drop positions below ``position`` (already emitted: never asked for again)."""
        for p in [p for p in self._by_position if p < position]:
            del self._by_position[p]

    def __len__(self) -> int:
        return len(self._by_position)
