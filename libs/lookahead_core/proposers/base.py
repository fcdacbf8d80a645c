"""The proposer seam: what every draft source does in a step, and how a verified tree's path is chosen.

A step asks a request's proposers in order (``Drafting.draft``); each adds nodes to the one tree within
what the step allows (``Ask``). A proposer may put extra rows in the forward after the tree's
(``extra``: the Jacobi window) and read the target's greedy choice after them (``observe``). The
path kept is the greedy match (``GreedyMatch``: lossless) unless a proposer owns acceptance (MJSD).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..drafting.draft import Drafter, DraftTree
from ..drafting.verify import accept_longest

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Ask:
    """What one step allows a request's drafts."""

    context: Sequence[int]  # prompt + output so far; its last token is the root every tree hangs below
    budget: int  # nodes the tree may hold in all once the proposer is done
    room: int  # deepest a branch may reach (a step emits at most room + 1 tokens: never past max_new_tokens)
    extend_to: int  # the trie may grow confident copies up to this many nodes (>= budget): to the config's
    # max_decoding_length from any text, past it (to the rest of the answer) along past outputs
    banned: frozenset[int]  # tokens never drafted (EOS: a step past it would be thrown away)


@dataclass(frozen=True)
class ExtraRows:
    """Rows a proposer puts in the forward after the tree's (root first): the Jacobi window."""

    ids: list[int]  # [L] token ids
    positions: list[int]  # [L] their positions in the request
    visible: np.ndarray  # [q+L, q+L] bool: what the tree's q rows and these L rows see of each other
    keep: slice  # the rows (offsets into the L) whose greedy next token ``observe`` wants


class Proposer:
    """A draft source. The base adds nothing, asks for no rows and ignores results."""

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        """Add nodes below the root of ``tree`` (at most ``ask.budget`` in all, ``ask.room`` deep)."""

    def extra_tokens(self) -> int:
        """Tokens ``extra`` puts in the next forward (0: none)."""
        return 0

    def extra(self, parents: Sequence[int], past: int) -> ExtraRows | None:
        """This step's extra rows after a tree with ``parents`` over ``past`` cached entries, or None."""
        return None

    def observe(self, guesses: Sequence[int]) -> None:
        """The target's greedy next token after each kept extra row (``ExtraRows.keep``)."""


class Acceptor(Protocol):
    """How a verified tree's path is chosen."""

    needs_logits: bool  # whether ``accept`` reads the target's logits rows (not only the choices)

    def accept(self, tree: DraftTree, predicted: Sequence[int], rows: torch.Tensor | None) -> list[int]:
        """The accepted path (node indices, root 0 first) from the choice after every node, or the
        tree's logits rows ([1 + len(tree), vocab]) when ``needs_logits``."""
        ...


class GreedyMatch:
    """Lossless acceptance: the longest path whose every node is the token chosen after its parent."""

    needs_logits = False

    def accept(self, tree: DraftTree, predicted: Sequence[int], rows: torch.Tensor | None) -> list[int]:
        return accept_longest(tree.tokens, tree.parents, predicted)


class DrafterProposer(Proposer):
    """A caller's drafting function (``draft.Drafter``) as the request's only proposer."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        tree.merge(self.drafter(list(ask.context), ask.budget, ask.room), merge=False)


@dataclass
class Drafting:
    """A request's draft sources and acceptance, built once when it is admitted (``build.build_drafting``)."""

    proposers: tuple[Proposer, ...]  # asked in order; each fills what the ones before left of the budget
    acceptor: Acceptor  # how each step's path is chosen
    budget: int  # draft nodes a step asks for before the engine splits the forward (0: one token a step)

    def draft(self, ask: Ask) -> DraftTree:
        """This step's tree from every proposer in turn."""
        tree = DraftTree()
        if ask.budget <= 0 or ask.room <= 0:
            return tree
        for proposer in self.proposers:
            proposer.draft(tree, ask)
        return tree

    def extra_tokens(self) -> int:
        """Tokens the proposers put in each forward beside the tree."""
        return sum(p.extra_tokens() for p in self.proposers)

    def extra(self, parents: Sequence[int], past: int) -> ExtraRows | None:
        """The one proposer's extra rows this step (only the Jacobi window asks for any), or None."""
        for proposer in self.proposers:
            rows = proposer.extra(parents, past)
            if rows is not None:
                return rows
        return None

    def observe(self, guesses: Sequence[int]) -> None:
        for proposer in self.proposers:
            if proposer.extra_tokens():
                proposer.observe(guesses)
