"""Expected tokens per step for every draft budget, from measured acceptance.

Drafts are built best-first, so a tree of budget q is a prefix of a bigger one: a step that
drafted ``size`` nodes tells what any budget q <= size would have accepted (the accepted path's
nodes with index <= q; ``budget.accepted_within``). A step that drafted fewer than q nodes says
nothing about q. So the estimate for q averages only the steps that drafted at least q nodes:
the request's own recent steps first, the engine's recent steps of all requests where the
request has too few, and where nobody has drafted that many nodes yet, this step's tree itself:
node q adds its trie path probability times ``prior_scale`` (so budgets that shrank under load,
or never grew past what was tried, can grow where the trie is confident: a copy in progress).

Example: a request whose last two steps drafted 4 nodes and accepted paths (1, 2) and (1,), and
whose tree now has 6 nodes of probability 1.0, 0.9, 0.9, 0.8, 0.8, 0.8:
``GainsModel(GainsConfig(min_steps=1, prior_scale=0.5)).expected(history, probs)`` is
[1.0, 2.0, 2.5, 2.5, 2.5, 2.9, 3.3] (tokens per step for q = 0..6; past 4, the tree's own
confidence at half weight).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .budget import accepted_within

Step = tuple[tuple[int, ...], int]  # (accepted node indices after the root, nodes drafted)


@dataclass(frozen=True)
class GainsConfig:
    """How acceptance history becomes an estimate."""

    window: int = 16  # a request's most recent steps that count
    pool_window: int = 512  # the engine's most recent steps (all requests) that count
    min_steps: int = 4  # below this many informative own steps, the engine's steps fill in
    prior_scale: float = 0.5  # unobserved budgets: a node adds this times its trie path probability
    confident: float = 0.9  # ... except a node at least this probable (a copy in progress) adds its probability


def mean_gain(steps: Sequence[Step], q: int) -> tuple[float, int]:
    """(mean accepted draft tokens at budget q, informative steps) over steps that drafted >= q."""
    informative = [path for path, size in steps if size >= q]
    if not informative:
        return 0.0, 0
    return sum(accepted_within(path, q) for path in informative) / len(informative), len(informative)


class GainsModel:
    """The engine's acceptance memory; ``expected`` gives a request's tokens-per-step curve.

    The pooled sums are kept incrementally (``_sums[q]``, ``_counts[q]`` over the pool's steps that
    drafted >= q nodes), so a step's estimates cost O(cap) per request, not O(pool).
    """

    def __init__(self, config: GainsConfig | None = None) -> None:
        self.config = config or GainsConfig()
        self.pool: deque[Step] = deque()
        self._sums: list[float] = [0.0]
        self._counts: list[int] = [0]

    def observe(self, path: tuple[int, ...], size: int) -> None:
        """Remember one step of any request (called by the scheduler thread only)."""
        self.pool.append((path, size))
        self._add(path, size, 1)
        if len(self.pool) > self.config.pool_window:
            old_path, old_size = self.pool.popleft()
            self._add(old_path, old_size, -1)

    def _add(self, path: tuple[int, ...], size: int, sign: int) -> None:
        while len(self._sums) <= size:
            self._sums.append(0.0)
            self._counts.append(0)
        for q in range(1, size + 1):
            self._sums[q] += sign * accepted_within(path, q)
            self._counts[q] += sign

    def pooled(self, q: int) -> tuple[float, int]:
        """(mean accepted draft tokens at budget q, informative steps) over the engine's pool."""
        if q >= len(self._counts) or not self._counts[q]:
            return 0.0, 0
        return self._sums[q] / self._counts[q], self._counts[q]

    def expected(self, history: Sequence[Step], probs: Sequence[float]) -> list[float]:
        """Tokens a step emits for budgets 0..len(probs) (1 for q = 0), non-decreasing.

        ``probs``: this step's best-first tree, node by node (trie path probabilities).
        """
        cfg = self.config
        own = list(history[-cfg.window :])
        out = [1.0]
        for q in range(1, len(probs) + 1):
            gain, n = mean_gain(own, q)
            if n < cfg.min_steps and probs[q - 1] >= cfg.confident:
                # A confident copy (a repeated answer) is this request's own evidence; the engine's
                # average over other requests would price it as an ordinary cold draft.
                out.append(out[-1] + probs[q - 1])
                continue
            if n < cfg.min_steps:
                pooled, m = self.pooled(q)
                if m:
                    gain = (gain * n + pooled * (cfg.min_steps - n)) / cfg.min_steps
                elif not n:  # nobody drafted this far yet: the tree's own confidence
                    out.append(out[-1] + cfg.prior_scale * probs[q - 1])
                    continue
            out.append(max(out[-1], 1.0 + gain))
        return out
