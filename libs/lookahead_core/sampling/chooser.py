"""The token the model chooses after each node of a step's tree: greedy or keyed sampling, one request.

Greedy takes the argmax of the processed logits; sampling takes
``argmax(processed logits + keyed_gumbel(seed, output position))`` (Gumbel-max: an exact draw from
``softmax(processed)``, where tokens cut by top-k / top-p / min-p are -inf). Either way the choice
after a node is a function of (the node's context, its output position) only, so verifying a draft
tree with ``accept_longest`` keeps exactly the tokens one-token-per-forward decoding would emit:
drafts change how many tokens a forward yields, never which.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..config import DecodingConfig
from .gumbel import GumbelCache
from .processors import CONTEXT_FREE, build_processors

RANDOM_SEED_BITS = 63  # a request without a seed gets one of these (fits a signed int64 too)


def resolve_seed(config: DecodingConfig) -> int | None:
    """The seed a run uses: the request's, a fresh random one when sampling without one, None when greedy."""
    if not config.sampling:
        return None
    return config.seed if config.seed is not None else secrets.randbits(RANDOM_SEED_BITS)


class TokenChooser:
    """Chooses one request's tokens from a step's logits (see the module docstring).

    Built once per request (``for_request``) and fed every step, in order of output position.
    ``plain`` (greedy, no processors) is today's fast path: one argmax over all nodes.
    """

    def __init__(
        self,
        processors: LogitsProcessorList | None = None,
        seed: int | None = None,
    ) -> None:
        self.processors = processors if processors is not None else LogitsProcessorList()
        self.seed = seed  # None: greedy; else the sampling key
        split = max((i + 1 for i, p in enumerate(self.processors) if not isinstance(p, CONTEXT_FREE)), default=0)
        self._by_depth = LogitsProcessorList(self.processors[:split])  # need each node's context
        self._all_rows = LogitsProcessorList(self.processors[split:])  # row-wise only: all nodes at once
        self._noise: GumbelCache | None = None

    @classmethod
    def for_request(
        cls,
        generation_config: GenerationConfig,
        config: DecodingConfig,
        prompt_len: int,
        seed: int | None,
        device: torch.device | str = "cpu",
    ) -> TokenChooser:
        """The chooser of a request: its processors (processors.py) and, when sampling, its seed."""
        procs = build_processors(generation_config, config, prompt_len, device)
        if config.sampling and seed is None:
            raise ValueError("a sampling request needs its seed resolved first (resolve_seed)")
        return cls(procs, seed if config.sampling else None)

    @property
    def sampling(self) -> bool:
        return self.seed is not None

    @property
    def plain(self) -> bool:
        """Greedy without processors: the choice is the argmax of the raw logits."""
        return self.seed is None and not self.processors

    def choose(
        self,
        logits: torch.Tensor,
        context: Sequence[int],
        parents: Sequence[int] | None = None,
        tokens: Sequence[int] | None = None,
        position: int = 0,
    ) -> list[int]:
        """The token chosen after each node of a step's tree.

        ``logits`` [q, vocab]: row i holds the model's logits after node i (node 0 = the root, the
        last token emitted, already at the end of ``context``); ``tokens`` / ``parents`` describe
        nodes 1..q-1 as in ``accept_longest`` (None: the root alone, q = 1). ``context`` is the
        prompt plus the output so far; ``position`` is the output position of the root's choice
        (tokens emitted so far). Node i's context is ``context`` + the tokens on its path, and its
        choice lands at output position ``position + depth(i)``.

        Worked example: output so far [5, 9] after prompt [1, 2] (context [1, 2, 5, 9], position 2),
        tree tokens [7, 3, 4] with parents [0, 1, 0]: node 1 (token 7, depth 1) has context
        [1, 2, 5, 9, 7] and position 3; node 2 (token 3, below node 1) has [1, 2, 5, 9, 7, 3] and
        position 4; node 3 (token 4, depth 1) has [1, 2, 5, 9, 4] and position 3. Sampling uses the
        noise of position 2 for the root, 3 for nodes 1 and 3, 4 for node 2.
        """
        if self.plain:
            return logits.argmax(-1).tolist()  # [q]
        q = logits.shape[0]
        parents, tokens = parents or (), tokens or ()
        if len(parents) != q - 1 or len(tokens) != q - 1:
            raise ValueError(f"{q} logits rows need {q - 1} nodes, got {len(tokens)} tokens, {len(parents)} parents")
        depths, paths = _tree_paths(parents, tokens)
        scores = logits.float()  # [q, vocab] (generate processes float32 scores)
        if self.processors and scores is logits:
            scores = scores.clone()  # processors may write in place: never into the caller's logits
        if self._by_depth:
            ctx = torch.tensor(list(context), dtype=torch.long, device=logits.device)  # [L]
            for d, nodes in _group_by_depth(depths).items():
                n = len(nodes)
                idx = torch.tensor(nodes, device=logits.device)  # [n] nodes at depth d
                tail = torch.tensor([paths[i] for i in nodes], dtype=torch.long, device=logits.device).view(n, d)
                ids = torch.cat([ctx.expand(n, -1), tail], dim=1)  # [n, L + d]: each node's own context
                scores[idx] = _apply(self._by_depth, ids, scores[idx])  # [n, vocab]
        if self._all_rows:
            # context-free: input_ids are never read, only their batch size must agree
            scores = _apply(self._all_rows, torch.empty(q, 0, dtype=torch.long, device=logits.device), scores)
        if self.seed is not None:
            scores = scores + self._noise_rows(logits, depths, position)  # [q, vocab]
        return scores.argmax(-1).tolist()  # [q]

    def _noise_rows(self, logits: torch.Tensor, depths: list[int], position: int) -> torch.Tensor:
        """Each node's Gumbel noise: [q, vocab], row i that of position + depths[i]."""
        assert self.seed is not None
        if self._noise is None:
            self._noise = GumbelCache(self.seed, logits.shape[-1], logits.device)
        self._noise.forget_before(position)  # earlier positions are emitted: never asked for again
        per_depth = torch.stack([self._noise(position + d) for d in range(max(depths) + 1)])  # [D + 1, vocab]
        return per_depth[torch.tensor(depths, device=logits.device)]  # [q, vocab]


def _apply(processors: LogitsProcessorList, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``processors(input_ids, scores)`` without LogitsProcessorList's per-call signature inspection
    (none of generate's processors takes extra arguments)."""
    for proc in processors:
        scores = proc(input_ids, scores)
    return scores


def _tree_paths(parents: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Depth and token path (root excluded) of every node, root first; parents precede children."""
    depths, paths = [0], [[]]
    for parent, token in zip(parents, tokens, strict=True):
        depths.append(depths[parent] + 1)
        paths.append([*paths[parent], token])
    return depths, paths


def _group_by_depth(depths: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for node, d in enumerate(depths):
        groups[d].append(node)
    return groups
