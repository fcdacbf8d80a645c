"""A step's plan, as a value: who runs, with which tree and budget, and which prompt chunks prefill.

``plan_step`` decides it (the scheduler runs it, ``pack.pack_step`` lays it out in one row); nothing in
a plan has run yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..drafting.draft import DraftTree
from .active import Active
from .budget import split_budget
from .gains import GainsModel
from .request import Phase


@dataclass(frozen=True)
class Decode:
    """A decoding request's part of a step: the tree it verifies and the draft budget it was granted."""

    req: Active
    tree: DraftTree
    budget: int


@dataclass(frozen=True)
class Chunk:
    """A prefilling request's part of a step: prompt positions [first, end)."""

    req: Active
    first: int
    end: int

    @property
    def last(self) -> bool:
        """Whether the prompt ends in this chunk (its last row's logits give the first output token)."""
        return self.end == len(self.req.prompt_ids)


@dataclass(frozen=True)
class StepPlan:
    """One step: decodes first, then chunks, all in one forward."""

    decodes: list[Decode] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.chunks

    @property
    def requests(self) -> list[Active]:
        return [d.req for d in self.decodes] + [c.req for c in self.chunks]


@dataclass(frozen=True)
class StepLimits:
    """What bounds a step (from SchedulerConfig)."""

    max_tokens: int  # tokens in one forward: drafts, roots, windows and prefill chunks together
    prefill_chunk: int  # prompt tokens prefilled per forward


def prefill_chunks(live: Sequence[Active], limits: StepLimits, decoding: int) -> list[Chunk]:
    """The next prompt chunks of prefilling requests, in order, within the prefill chunk and the forward
    (each of the ``decoding`` requests keeps at least its root's place)."""
    chunks: list[Chunk] = []
    room = min(limits.prefill_chunk, limits.max_tokens - decoding)
    for req in (r for r in live if r.req.phase is Phase.PREFILL):
        if room <= 0:
            break
        end = min(len(req.prompt_ids), req.prefilled + room)
        chunks.append(Chunk(req, req.prefilled, end))
        room -= end - req.prefilled
    return chunks


def plan_step(live: Sequence[Active], limits: StepLimits, gains: GainsModel | None,
              cost: Callable[[int], float] | None) -> StepPlan:
    """This step: every prefill chunk that fits, and every decoding request's tree within the forward.

    Every request's full tree is drafted first (best-first, so a budget of q keeps its first q nodes),
    then the forward's spare tokens are split by expected gain against measured ``cost``
    (``split_budget``; ``gains`` None or no curve: every tree as drafted).
    """
    decoding = [r for r in live if r.req.phase is Phase.DECODE]
    chunks = prefill_chunks(live, limits, len(decoding))
    if not decoding:
        return StepPlan([], chunks)
    base = sum(c.end - c.first for c in chunks)
    spare = limits.max_tokens - base - sum(1 + r.drafting.extra_tokens() for r in decoding)
    trees = []
    for req in decoding:
        cap = min(req.max_budget(), max(0, spare))
        extend = min(req.config.max_decoding_length, max(cap, spare)) if cap == req.max_budget() else cap
        tree = req.draft(cap, extend)
        spare -= len(tree)
        trees.append(tree)
    budgets = [len(t) for t in trees]
    if gains is not None and cost is not None:
        expected = [gains.expected(r.history, t.probs) for r, t in zip(decoding, trees, strict=True)]
        budgets = split_budget(expected, cost, base, limits.max_tokens)
    decodes = [Decode(r, t.prefix(q), q) for r, t, q in zip(decoding, trees, budgets, strict=True)]
    return StepPlan(decodes, chunks)
