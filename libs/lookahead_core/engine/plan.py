"""A step's plan, as a value: who runs, with which tree and budget, and which prompt chunks prefill.

``plan_step`` decides it (the scheduler runs it, ``pack.pack_step`` lays it out in one row, ``run.choose``
reads it); nothing in a plan has run yet. Like vLLM's ``SchedulerOutput`` it names requests by id and
carries what the forward needs of them as data (roots, cache lengths, trees, prompt spans): packing and
running never touch a request; ``apply.apply_step`` looks each one up again by id to update it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..drafting.draft import DraftTree, within_vocab
from ..proposers.base import ExtraRows
from .active import Active
from .budget import split_budget
from .gains import GainsModel
from .request import Phase
from .ttft import Pending, share_ceiling, step_ceiling


@dataclass(frozen=True)
class Decode:
    """A decoding request's part of a step: the tree it verifies, the draft budget it was granted, and
    what packing and choosing read of the request, taken when the step was planned."""

    id: str  # the request's id (apply_step looks the request up by it)
    tree: DraftTree
    budget: int
    root: int  # the last emitted token: verified, not yet in the cache; the tree hangs below it
    past: int  # entries in the request's KV cache: the root's position
    extra: ExtraRows | None  # rows its proposers add after the tree (the Jacobi window), or None
    context: list[int]  # prompt + output so far: what its chooser's processors see before the tree
    emitted: int  # output tokens so far: the output position of the root's choice


@dataclass(frozen=True)
class Chunk:
    """A prefilling request's part of a step: prompt positions [first, end)."""

    id: str  # the request's id (apply_step looks the request up by it)
    prompt: list[int]  # the request's whole prompt (read only)
    first: int
    end: int

    @property
    def tokens(self) -> list[int]:
        """The chunk's prompt tokens."""
        return self.prompt[self.first : self.end]

    @property
    def last(self) -> bool:
        """Whether the prompt ends in this chunk (its last row's logits give the first output token)."""
        return self.end == len(self.prompt)


@dataclass(frozen=True)
class StepPlan:
    """One step: decodes first, then chunks, all in one forward."""

    decodes: list[Decode] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.chunks

    @property
    def ids(self) -> list[str]:
        """The ids of the step's requests, decodes first."""
        return [d.id for d in self.decodes] + [c.id for c in self.chunks]


@dataclass(frozen=True)
class StepLimits:
    """What bounds a step (from SchedulerConfig)."""

    max_tokens: int  # tokens in one forward: drafts, roots, windows and prefill chunks together
    prefill_chunk: int  # prompt tokens prefilled per forward
    ttft_target_s: float = math.inf  # while prompts wait, steps stay short enough to meet this (ttft.py)
    vocab_size: int | None = None  # the model's embedding rows: drafted ids at or past it are dropped
    prefill_tree_share: float = math.inf  # while prompts prefill, trees add at most this share to a step's time
    prefill_lead_s: float = math.inf  # a tenant that used this much more engine time than a decoding one waits


def fair_prefill(needs: Sequence[int], tenants: Sequence[str], room: int,
                 usage: Mapping[str, float] | None = None) -> list[int]:
    """Prompt tokens each prefilling request gets this step: the tenants by recent ``usage`` (decayed engine
    seconds, engine/usage.py; None or absent: 0), the least used first, each taking what it needs of what is
    left; tenants of equal usage split their room evenly (a tenant needing less leaves the rest to the others:
    max-min fair), each tenant's share filled in its requests' order.
    Examples: needs (300, 300, 40), tenants (a, a, b), room 256 -> (216, 0, 40): b's 40 fit in its half, a takes
    the rest; needs (300, 300), tenants (a, b), room 256 -> (128, 128); the same with usage {a: 5000} ->
    (0, 256): b used less lately, so its prompt goes first."""
    usage = usage or {}
    order = list(dict.fromkeys(tenants))  # tenants in their first request's order
    demand = {t: sum(n for n, u in zip(needs, tenants, strict=True) if u == t) for t in order}
    given = dict.fromkeys(order, 0)
    left = room
    for level in sorted({usage.get(t, 0.0) for t in order}):  # the least used tenants first
        hungry = [t for t in order if usage.get(t, 0.0) == level and demand[t] > 0]
        while left > 0 and hungry:
            share = max(1, left // len(hungry))
            for t in list(hungry):
                give = min(share, demand[t] - given[t], left)
                given[t] += give
                left -= give
                if given[t] == demand[t]:
                    hungry.remove(t)
                if not left:
                    break
    out = []
    for need, t in zip(needs, tenants, strict=True):
        take = min(need, given[t])
        given[t] -= take
        out.append(take)
    return out


def outweighed(live: Sequence[Active], usage: Mapping[str, float], lead_s: float) -> set[str]:
    """Tenants whose prompts wait this step: each used more than ``lead_s`` seconds of the engine lately beyond
    the least used tenant now decoding, so a chunk of its prompt would slow that tenant's steps again (it
    prefills once that tenant has caught up; with no one else decoding it never waits). Example: usage
    {hog: 9.0, b: 1.0}, b decoding, the hog prefilling, lead 2 -> {hog}; lead 10 -> {}."""
    floor = min((usage.get(r.req.tenant, 0.0) for r in live if r.req.phase is Phase.DECODE), default=None)
    if floor is None:
        return set()
    return {r.req.tenant for r in live
            if r.req.phase is Phase.PREFILL and usage.get(r.req.tenant, 0.0) > floor + lead_s}


def prefill_chunks(live: Sequence[Active], limits: StepLimits, decoding: int,
                   usage: Mapping[str, float] | None = None) -> list[Chunk]:
    """The next prompt chunks of prefilling requests within the prefill chunk and the forward (each of the
    ``decoding`` requests keeps at least its root's place), the room shared fairly by tenant, the least recently
    served first (``fair_prefill``: one tenant's long prompts never hold back another's first token), none for
    a tenant far ahead of a decoding one (``outweighed``: its prompt would slow that tenant's every step)."""
    room = max(0, min(limits.prefill_chunk, limits.max_tokens - decoding))
    waiting = outweighed(live, usage or {}, limits.prefill_lead_s)
    prefilling = [r for r in live if r.req.phase is Phase.PREFILL and r.req.tenant not in waiting]
    grants = fair_prefill([len(r.prompt_ids) - r.prefilled for r in prefilling],
                          [r.req.tenant for r in prefilling], room, usage)
    return [Chunk(r.id, r.prompt_ids, r.prefilled, r.prefilled + g)
            for r, g in zip(prefilling, grants, strict=True) if g > 0]


def pending(live: Sequence[Active], target_s: float, now: float) -> list[Pending]:
    """The prefilling requests, in prefill order: prompt tokens left and seconds until ``target_s`` after
    their arrival (``now``: time.perf_counter(), the clock of ``ServeRequest.submitted``)."""
    return [Pending(len(r.prompt_ids) - r.prefilled, target_s - (now - r.req.submitted))
            for r in live if r.req.phase is Phase.PREFILL]


def plan_step(live: Sequence[Active], limits: StepLimits, gains: GainsModel | None,
              cost: Callable[[int], float] | None, now: float = 0.0, usage: Mapping[str, float] | None = None
              ) -> StepPlan:
    """This step: every prefill chunk that fits, and every decoding request's tree within the forward.

    Prefill chunks come first and each decode keeps its root. With a measured ``cost``, the forward is
    capped so that every prefilling request still meets ``limits.ttft_target_s`` (ttft.step_ceiling) and so
    that its trees add at most ``limits.prefill_tree_share`` to its time (ttft.share_ceiling;
    ``now``: time.perf_counter(); ``usage``: each tenant's recent prefill, ``fair_prefill``). Trees are drafted
    best-first in what is left (a budget of q keeps a tree's first q nodes; each request's base budget is
    reserved before an earlier one's confident copy may extend past its own), then split by expected gain
    against ``cost``: the decodes' own tokens per second, the prefill chunks left out, since their tokens are
    work that is due anyway and would make every tree token look free (``split_budget``; ``gains`` None or no
    curve: every tree as drafted).
    """
    decoding = [r for r in live if r.req.phase is Phase.DECODE]
    chunks = prefill_chunks(live, limits, len(decoding), usage)
    if not decoding:
        return StepPlan([], chunks)
    base = sum(c.end - c.first for c in chunks)
    extra = sum(r.drafting.extra_tokens() for r in decoding)
    ceiling = limits.max_tokens
    if cost is not None and chunks:
        chunk = max(1, min(limits.prefill_chunk, limits.max_tokens - len(decoding)))
        floor = base + len(decoding) + extra
        ceiling = min(step_ceiling(pending(live, limits.ttft_target_s, now), chunk, floor, limits.max_tokens, cost),
                      share_ceiling(cost, floor, limits.max_tokens, limits.prefill_tree_share))
    spare = ceiling - base - len(decoding) - extra
    reserved = sum(r.max_budget() for r in decoding)  # every request's base budget, before any extension
    trees = []
    for req in decoding:
        full = req.max_budget()
        reserved -= full
        cap = min(full, max(0, spare))
        extend = min(req.max_extend(), max(cap, spare - reserved)) if cap == full else cap
        tree = req.draft(cap, extend)
        if limits.vocab_size is not None:  # a planted id must never reach the shared forward
            tree = within_vocab(tree, limits.vocab_size)
        spare -= len(tree)
        trees.append(tree)
    budgets = [len(t) for t in trees]
    if gains is not None and cost is not None:
        expected = [gains.expected(r.history, t.probs) for r, t in zip(decoding, trees, strict=True)]
        budgets = split_budget(expected, cost, extra, ceiling - base)
    return StepPlan([decode(r, t.prefix(q), q) for r, t, q in zip(decoding, trees, budgets, strict=True)], chunks)


def decode(req: Active, tree: DraftTree, budget: int) -> Decode:
    """``req``'s part of the step as data: ``tree`` (its final shape) under ``budget``, and its root, cache
    length, proposers' extra rows over that tree, context and output position as they are now."""
    past = req.kv.length
    return Decode(req.id, tree, budget, req.root(), past, req.drafting.extra(tree.parents, past), req.context(),
                  req.emitted)
