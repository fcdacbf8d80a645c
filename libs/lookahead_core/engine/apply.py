"""Apply a step's results: each decode's accepted path (its KV kept by the backend, tokens emitted, the window
fed) and each prefill chunk's progress (its entries made valid by the backend, a finished prompt's KV kept for
later prompts, its first token emitted).

The one phase of a step that changes requests: the plan names them by id, and each is looked up here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..kv.prefix_cache import PrefixKVCache
from .active import Active, Emitting
from .gains import GainsModel
from .pack import PackedStep
from .plan import StepPlan


@dataclass(frozen=True)
class Forward:
    """What ran the step (each request's stats record it)."""

    tokens: int  # tokens in the forward
    batch: int  # requests in it
    kernel: str  # the kernel twin that ran it


def apply_step(plan: StepPlan, packed: PackedStep, logits: torch.Tensor, predicted: list[int], ran: Forward,
               running: Mapping[str, Active], gains: GainsModel, prefix_cache: PrefixKVCache,
               out: Emitting) -> list[tuple[Active, Exception]]:
    """Apply ``plan``'s forward: ``logits`` [K, vocab] of the kept rows, ``predicted`` [K] their choices;
    ``running``: the step's requests by id; ``out``: the engine's decode and profile, for emitting. Returns
    the requests whose own results could not be applied, with the error (they fail alone)."""
    failed: list[tuple[Active, Exception]] = []
    for d, rows in zip(plan.decodes, packed.decodes, strict=True):
        req = running[d.id]
        try:
            wants = req.drafting.acceptor.needs_logits or req.config.logprobs
            rows_logits = logits[rows.tree] if wants else None  # [q, vocab]
            accepted = req.accept(d.tree, predicted[rows.tree], rows_logits, d.budget, out)
            gains.observe(accepted, len(d.tree))
            req.drafting.observe(predicted[rows.extra])  # the window's guesses follow its tree's rows
            req.rode(ran.batch, ran.tokens, ran.kernel)
        except Exception as exc:  # one request's proposer or stop check fails only it
            failed.append((req, exc))
    for c, row in zip(plan.chunks, packed.first_rows, strict=True):
        req = running[c.id]
        try:
            req.prefilled_to(c.end)  # its entries made valid by the backend
            req.rode(ran.batch, ran.tokens, ran.kernel)
            if row is not None:
                prefilled(req, predicted[row], prefix_cache, logits[row : row + 1], out)
        except Exception as exc:  # its chunk, its prefix store, its first token: only it
            failed.append((req, exc))
    return failed


def prefilled(active: Active, first: int, prefix_cache: PrefixKVCache, row: torch.Tensor, out: Emitting) -> None:
    """The prompt is in the cache: keep its KV for later prompts and emit the first token (``row`` [1, vocab]:
    the logits it was chosen from, read only for a request's logprobs)."""
    req = active.req
    n = len(req.prompt_ids)
    if req.stats.prefix_hit_tokens < n - 1:  # nothing new to keep when a repeat's prefix covered it
        # a prompt built before a forget of its tenant (stale epoch) is not kept
        prefix_cache.put(req.tenant, req.prompt_ids, active.prompt_kv(), epoch=req.prefix_epoch)
    req.stats.prefill_s = time.perf_counter() - req.submitted - req.stats.queue_wait_s
    active.emit([first], active.logprobs_of(row, [first]) if active.config.logprobs else None, out)
