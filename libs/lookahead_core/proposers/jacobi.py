"""The Jacobi lookahead window as a proposer: extra rows in the verification forward, and its n-gram pool.

Per step (``JacobiProposer``, asked by the step like every proposer):

1. ``draft(tree, ask)`` adds the pool's n-grams that start with the root (the last emitted token)
   below the root of this step's tree (merged with what the trie drafted);
2. ``extra(parents, past)`` gives the window's tokens to ride after the tree's: positions
   ``past + l + j + 1``, each sees the cache, the root and the window tokens ``window_mask`` lets it
   see, never a tree node (and no tree node sees them);
3. after the forward, ``observe(guesses)`` takes the target's greedy next token after each token of
   the window's last row, advances the window and puts the new n-grams in the pool.

The window's KV is dropped by the accepted-path compaction (its rows are never on a path), and what it
drafts is verified like any draft: output stays exactly plain decoding's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..drafting.draft import DraftTree, ancestor_matrix
from ..drafting.jacobi import (
    JacobiConfig,
    NgramPool,
    Window,
    advance,
    choose_window,
    initial_window,
    positions,
    window_mask,
)
from .base import Ask, ExtraRows, Proposer

DEFAULT_JACOBI_WINDOW = 4  # mode jacobi without a measured curve: guess this many positions per row


def visible_with_window(parents: Sequence[int], window: Window) -> np.ndarray:
    """What each token of a step sees among the step's own tokens: [q+L, q+L] bool.

    The q tree tokens (root first) see their ancestors (``ancestor_matrix``) and no window token; each
    of the L window tokens sees the root (the current input token), the window tokens ``window_mask``
    lets it see, and no draft node.
    """
    anc = ancestor_matrix(list(parents))  # [q, q]
    q, n = anc.shape[0], sum(len(row) for row in window)
    out = np.zeros((q + n, q + n), dtype=bool)  # [q+L, q+L]
    out[:q, :q] = anc
    out[q:, 0] = True  # the root
    out[q:, q:] = np.array(window_mask(window), dtype=bool).reshape(n, n)  # [L, L]
    return out


def window_ids_positions(window: Window, past_len: int) -> tuple[list[int], list[int]]:
    """The window's tokens (row-major) and their positions: ``past_len + l + j + 1``."""
    return [t for row in window for t in row], [past_len + p for p in positions(window)]


def add_pool_drafts(tree: DraftTree, tails: Sequence[Sequence[int]], room: int, limit: int,
                    banned: frozenset[int] = frozenset()) -> int:
    """Add each continuation below the root (merged with what is there), cut at ``room`` tokens deep,
    before a banned token, and once the tree has ``limit`` nodes; returns the nodes added."""
    before = len(tree)
    for tail in tails:
        parent = 0
        for token in tail[:room]:
            if token in banned or (len(tree) >= limit and tree.child(parent, token) is None):
                break
            parent = tree.add(parent, token, merge=True)
    return len(tree) - before


class JacobiProposer(Proposer):
    """The window and the n-gram pool of one request (see the module docstring)."""

    def __init__(self, context: Sequence[int], config: JacobiConfig, banned: frozenset[int] = frozenset()) -> None:
        self.config = config
        self.banned = banned
        self.window = initial_window(context, config)
        self.pool = NgramPool(config.guesses)
        self.drafted = 0  # pool tokens added to trees (after merging)

    def extra_tokens(self) -> int:
        """Window tokens each forward carries (L)."""
        return len(self.window) * self.config.window

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        """Add the pool's continuations of the root (the context's last token), ``ask.budget`` nodes in all."""
        tails = self.pool.get(ask.context[-1])[: self.config.guesses]
        self.drafted += add_pool_drafts(tree, tails, ask.room, ask.budget, self.banned)

    def extra(self, parents: Sequence[int], past: int) -> ExtraRows:
        ids, pos = window_ids_positions(self.window, past)
        w = self.config.window
        last = slice((len(self.window) - 1) * w, len(self.window) * w)  # the last row: its guesses are read
        return ExtraRows(ids, pos, visible_with_window(parents, self.window), last)

    def observe(self, guesses: Sequence[int]) -> None:
        """The target's greedy next token after each token of the last row: advance, pool the n-grams."""
        self.window, grams = advance(self.window, list(guesses)[: self.config.window], self.config)
        self.pool.put(grams)


def window_size(jacobi: bool, asked: int | None, base_tokens: int, ngram: int,
                cost: Callable[[int], float] | None) -> int:
    """The window W a request runs: ``asked`` when given; else the widest the measured ``cost`` curve allows
    over a forward of ``base_tokens`` (``choose_window``), and without a curve 0 (no window). Mode jacobi
    (``jacobi``) always gets at least 1 (DEFAULT_JACOBI_WINDOW without a curve)."""
    if asked is not None:
        return asked
    if cost is None:
        return DEFAULT_JACOBI_WINDOW if jacobi else 0
    window = choose_window(cost, base_tokens, ngram)
    return max(window, 1) if jacobi else window
