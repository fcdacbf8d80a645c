"""One request's Jacobi lookahead branch in the verification forward: inputs, pool drafts, harvest.

Per step (``JacobiBranch``, driven by the decoding loop):

1. ``draft(tree, root, room)`` adds the pool's n-grams that start with the root (the last emitted
   token) below the root of this step's tree (merged with the trie's drafts);
2. ``extend(inputs, past_len)`` appends the window's tokens after the tree's: positions
   ``past_len + l + j + 1``, each sees the cache, the root and the window tokens ``branch_mask`` lets it
   see, never a tree node (and no tree node sees them);
3. after the forward, ``harvest(logits, q)`` reads the target's greedy next token after each token of
   the window's last row, advances the window and puts the new n-grams in the pool.

The branch's KV is dropped by the accepted-path compaction (its rows are never on a path), and what it
drafts is verified like any draft: output stays exactly the plain decoder's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch

from .config import DecodingConfig, DraftMode
from .draft import DraftTree
from .jacobi import (
    MAX_JACOBI_WINDOW,
    JacobiConfig,
    NgramPool,
    Window,
    advance,
    branch_mask,
    choose_window,
    initial_window,
    positions,
)
from .tree_inputs import TreeInputs, ancestor_matrix

DEFAULT_JACOBI_WINDOW = 4  # mode jacobi with jacobi_window = 0: guess this many positions per row


def visible_with_branch(parents: Sequence[int], window: Window) -> np.ndarray:
    """What each token of a step sees among the step's own tokens: [q+L, q+L] bool.

    The q tree tokens (root first) see their ancestors (``ancestor_matrix``) and no branch token; each
    of the L window tokens sees the root (the current input token), the window tokens ``branch_mask``
    lets it see, and no draft node.
    """
    anc = ancestor_matrix(list(parents))  # [q, q]
    q, n = anc.shape[0], sum(len(row) for row in window)
    out = np.zeros((q + n, q + n), dtype=bool)  # [q+L, q+L]
    out[:q, :q] = anc
    out[q:, 0] = True  # the root
    out[q:, q:] = np.array(branch_mask(window), dtype=bool).reshape(n, n)  # [L, L]
    return out


def branch_ids_positions(window: Window, past_len: int) -> tuple[list[int], list[int]]:
    """The window's tokens (row-major) and their positions: ``past_len + l + j + 1``."""
    return [t for row in window for t in row], [past_len + p for p in positions(window)]


def extend_inputs(inputs: TreeInputs, parents: Sequence[int], window: Window, past_len: int) -> TreeInputs:
    """``inputs`` (q tree tokens, root first, ``parents`` their tree) with the window's L tokens after them."""
    ids, pos = branch_ids_positions(window, past_len)
    device, dtype = inputs.attention_mask.device, inputs.attention_mask.dtype
    own = torch.from_numpy(visible_with_branch(parents, window)).to(device)  # [q+L, q+L]
    visible = torch.cat([torch.ones(own.shape[0], past_len, dtype=torch.bool, device=device), own], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)  # [q+L, past+q+L]
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return TreeInputs(
        torch.cat([inputs.input_ids, torch.tensor([ids], dtype=torch.long, device=device)], dim=1),  # [1, q+L]
        torch.cat([inputs.position_ids, torch.tensor([pos], dtype=torch.long, device=device)], dim=1),  # [1, q+L]
        mask[None, None],  # [1, 1, q+L, past+q+L]
    )


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


class JacobiBranch:
    """The window and the n-gram pool of one request (see the module docstring)."""

    def __init__(self, context: Sequence[int], config: JacobiConfig, banned: frozenset[int] = frozenset()) -> None:
        self.config = config
        self.banned = banned
        self.window = initial_window(context, config)
        self.pool = NgramPool(config.guesses)
        self.drafted = 0  # pool tokens added to trees (after merging)

    @property
    def tokens(self) -> int:
        """Window tokens this step's forward carries (L)."""
        return len(self.window) * self.config.window

    def draft(self, tree: DraftTree, root: int, room: int, limit: int) -> None:
        """Add the pool's continuations of ``root`` to ``tree`` (at most ``limit`` nodes in all)."""
        tails = self.pool.get(root)[: self.config.guesses]
        self.drafted += add_pool_drafts(tree, tails, room, limit, self.banned)

    def extend(self, inputs: TreeInputs, parents: Sequence[int], past_len: int) -> TreeInputs:
        return extend_inputs(inputs, parents, self.window, past_len)

    def last_row(self, q: int) -> slice:
        """Where the window's last row sits among a step's q + L rows (its predictions are harvested)."""
        w = self.config.window
        return slice(q + (len(self.window) - 1) * w, q + len(self.window) * w)

    def harvest(self, predictions: Sequence[int]) -> None:
        """The target's greedy next token after each token of the last row: advance, pool the n-grams."""
        self.window, grams = advance(self.window, predictions, self.config)
        self.pool.put(grams)


def resolve_window(config: DecodingConfig, cost: Callable[[int], float] | None) -> DecodingConfig:
    """``jacobi_window`` None (the default) made a number: the widest window the measured ``cost`` curve
    allows over a forward of the root and a full tree (``choose_window``); without a curve 0 (no branch),
    or DEFAULT_JACOBI_WINDOW in mode jacobi, which always gets at least 1. Other configs pass unchanged."""
    modes = (DraftMode.HIERARCHICAL, DraftMode.JACOBI)
    if config.jacobi_window is not None or config.mode not in modes:
        return config
    jacobi = config.mode is DraftMode.JACOBI
    if cost is None:
        window = DEFAULT_JACOBI_WINDOW if jacobi else 0
    else:
        window = choose_window(cost, 1 + config.decoding_length, config.jacobi_ngram)
    return replace(config, jacobi_window=max(window, 1) if jacobi else window)


def branch_shape(config: DecodingConfig) -> JacobiConfig | None:
    """The request's window shape: mode jacobi (window ``jacobi_window`` or DEFAULT_JACOBI_WINDOW), or
    hierarchical with ``jacobi_window`` > 0; None otherwise (no branch). Resolve None first
    (``resolve_window``): unresolved, hierarchical has no branch."""
    window = config.jacobi_window or 0
    wanted = config.mode is DraftMode.JACOBI or (config.mode is DraftMode.HIERARCHICAL and window > 0)
    if not wanted:
        return None
    return JacobiConfig(config.jacobi_window or DEFAULT_JACOBI_WINDOW, config.jacobi_ngram, config.jacobi_guesses)


def branch_for(config: DecodingConfig, context: Sequence[int], banned: frozenset[int]) -> JacobiBranch | None:
    """A request's branch (``branch_shape``), or None."""
    shape = branch_shape(config)
    return JacobiBranch(context, shape, banned) if shape is not None else None


def branch_tokens(config: DecodingConfig) -> int:
    """The most window tokens a step of a request with this config carries (0 without a branch); an
    unresolved window counts as the widest ``resolve_window`` may pick."""
    if config.jacobi_window is None and config.mode in (DraftMode.HIERARCHICAL, DraftMode.JACOBI):
        return (config.jacobi_ngram - 1) * max(MAX_JACOBI_WINDOW, DEFAULT_JACOBI_WINDOW)
    shape = branch_shape(config)
    return shape.rows * shape.window if shape is not None else 0
