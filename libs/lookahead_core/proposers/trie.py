"""The request's token trie as a proposer: the prompt, references and past answers it was filled with."""

from __future__ import annotations

from dataclasses import replace

from ..config import DecodingConfig
from ..drafting.draft import DraftTree, TrieShape, retrieve_draft
from ..drafting.trie import TokenTrie
from .base import Ask, Proposer


class TrieProposer(Proposer):
    """Drafts from ``trie`` in ``shape`` (a tree, parallel chains or one span) each step."""

    def __init__(self, trie: TokenTrie, config: DecodingConfig, shape: TrieShape) -> None:
        self.trie = trie
        self.config = config
        self.shape = shape

    def draft(self, tree: DraftTree, ask: Ask) -> None:
        cfg = self.config
        grow = min(ask.extend_to, cfg.max_decoding_length)  # confident copies of any text
        if grow != cfg.max_decoding_length:
            cfg = replace(cfg, max_decoding_length=grow)
        own = retrieve_draft(self.trie, ask.context[-cfg.max_match :], cfg, budget=ask.budget, max_depth=ask.room,
                             banned=ask.banned, shape=self.shape, chain_to=ask.extend_to)
        tree.merge(own, merge=self.shape is not TrieShape.CHAINS)
