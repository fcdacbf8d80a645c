"""The one place a request's ``mode`` is read: which proposers it gets, and how its paths are accepted.

    spec = drafting_spec(config, cost)        # pure: the resolved config and what to build (no torch)
    drafting = build_drafting(spec, context, trie, eos, drafts)   # the request's proposers, at admission

``drafting_spec`` resolves the request's Jacobi window from the measured forward cost before anything is
sized, so the request's KV capacity (``DraftingSpec.max_step_tokens``) is known when it is admitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..config import DecodingConfig, DraftMode
from ..drafting.draft import Drafter
from ..drafting.jacobi import JacobiConfig
from ..drafting.trie import TokenTrie
from .base import Acceptor, DrafterProposer, Drafting, GreedyMatch, Proposer
from .jacobi import DEFAULT_JACOBI_WINDOW, JacobiProposer, window_size
from .trie import TrieProposer, TrieShape

if TYPE_CHECKING:
    from .draft_model import DraftModels

FLAT_SLACK = 0.10  # a tree widens past decoding_length only while its forward costs this little over one token's


class Source:
    """Names of the draft sources a spec may ask for (``DraftingSpec.sources``)."""

    DRAFT_MODEL = "draft-model"  # a draft model's top-k token tree where the trie is weak
    MJSD = "mjsd"  # a draft model's beams, accepted by joint likelihood


@dataclass(frozen=True)
class DraftingSpec:
    """What a request's drafting is made of, decided from its config alone."""

    config: DecodingConfig  # the request's config, its Jacobi window resolved
    trie: TrieShape | None  # how the trie drafts (None: the trie does not draft)
    window: JacobiConfig | None  # the Jacobi window and pool (None: no window)
    model: str | None  # Source.DRAFT_MODEL or Source.MJSD: the draft model's part (None: no draft model)

    @property
    def max_nodes(self) -> int:
        """Most draft nodes a step may verify (a trie tree may grow confident copies past the budget)."""
        cfg = self.config
        return max(cfg.decoding_length, cfg.max_decoding_length) if cfg.speculative else 0

    @property
    def budget(self) -> int:
        """Draft nodes a step asks for before the engine splits the forward (0: no speculation)."""
        return self.config.decoding_length if self.config.speculative else 0  # every mode but none drafts

    @property
    def max_step_tokens(self) -> int:
        """Most tokens one step of this request puts in the forward: root, tree and window."""
        window = self.window.rows * self.window.window if self.window is not None else 0
        return 1 + self.max_nodes + window


def flat_budget(cost: Callable[[int], float], widest: int, slack: float = FLAT_SLACK) -> int:
    """The most draft tokens a step may add while its forward costs at most ``slack`` over a one-token forward
    (powers of two up to ``widest``; 0 where even one costs more). Examples: cost(n) = 10 (flat, a launch-bound
    GPU) -> 128; cost(n) = 1 + n (a CPU) -> 0; cost(n) = 10 + n / 64 -> 64 (cost(65) = 11.016 <= 1.1 x 10.016,
    cost(129) is not)."""
    base, best, n = cost(1), 0, 1
    while n <= widest and cost(1 + n) <= (1.0 + slack) * base:
        best, n = n, n * 2
    return best


def drafting_spec(config: DecodingConfig, cost: Callable[[int], float] | None = None, widest: int = 0) -> DraftingSpec:
    """The request's drafting from its ``mode`` (the only function that reads it), its Jacobi window sized by
    the engine's measured forward ``cost`` (None: not measured), its draft budget widened up to ``widest`` tokens
    where that cost allows it nearly free (``flat_budget``: wide trees on a launch-bound accelerator; 0: the
    configured width, as the CPU backend keeps it)."""
    if cost is not None and widest and config.speculative:
        wide = flat_budget(cost, widest=widest)
        if wide > config.decoding_length:
            config = replace(config, decoding_length=wide, max_decoding_length=max(wide, config.max_decoding_length))
    mode = config.mode
    jacobi = mode is DraftMode.JACOBI
    if mode in (DraftMode.HIERARCHICAL, DraftMode.JACOBI):
        w = window_size(jacobi, config.jacobi_window, 1 + config.decoding_length, config.jacobi_ngram, cost)
        config = replace(config, jacobi_window=w)
    if mode is DraftMode.NONE:
        return DraftingSpec(config, None, None, None)
    shapes = {DraftMode.PARALLEL: TrieShape.CHAINS, DraftMode.LLMA: TrieShape.SPAN}
    trie = None if mode in (DraftMode.JACOBI, DraftMode.MJSD) else shapes.get(mode, TrieShape.TREE)
    window = None
    if jacobi or (mode is DraftMode.HIERARCHICAL and config.jacobi_window):
        window = JacobiConfig(config.jacobi_window or DEFAULT_JACOBI_WINDOW, config.jacobi_ngram,
                              config.jacobi_guesses)
    model = {DraftMode.DRAFT_MODEL: Source.DRAFT_MODEL, DraftMode.MJSD: Source.MJSD}.get(mode)
    return DraftingSpec(config, trie, window, model)


def build_drafting(spec: DraftingSpec, context: Sequence[int], trie: TokenTrie, eos: frozenset[int],
                   drafts: DraftModels | None = None, drafter: Drafter | None = None) -> Drafting:
    """A request's proposers, in the order they fill a step's tree: trie, Jacobi pool, draft model.

    ``drafter`` (tests' adversarial trees) replaces them all; ``drafts`` hands out draft models (None:
    a spec that wants one gets none, as a library user without a draft model)."""
    cfg = spec.config
    if drafter is not None:
        return Drafting((DrafterProposer(drafter),), GreedyMatch(), spec.budget)
    proposers: list[Proposer] = []
    acceptor: Acceptor = GreedyMatch()
    if spec.trie is not None:
        proposers.append(TrieProposer(trie, cfg, spec.trie))
    if spec.window is not None:
        proposers.append(JacobiProposer(context, spec.window, eos))
    if spec.model is not None and drafts is not None:
        from .draft_model import DraftModelProposer  # torch: only where a draft model runs
        from .mjsd import MjsdProposer

        draft = drafts.get(cfg.draft_layers)
        if spec.model == Source.MJSD:
            beams = MjsdProposer(draft, cfg.mjsd_beams, cfg.draft_depth, cfg.mjsd_threshold)
            proposers.append(beams)
            acceptor = beams
        else:
            proposers.append(DraftModelProposer(draft, cfg.draft_top_k, cfg.draft_depth))
    return Drafting(tuple(proposers), acceptor, spec.budget)
