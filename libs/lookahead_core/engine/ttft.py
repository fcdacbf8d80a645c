"""The step's token ceiling under a time-to-first-token target: trees yield to waiting prefills.

Every prompt token must be prefilled before its request's first token, and on a loaded machine a
forward's time grows with every token it carries. A step that also verifies big draft trees is slower,
so each waiting request needs as many steps as before, each one longer: its first token comes later.
So while prompts wait, the step's size is capped by what keeps every waiting request within
``ttft_target_s`` of its arrival: prefill chunks come first, each decode keeps its root (1 token),
and draft trees get what is left under the cap. When nothing waits there is no cap (the forward's own
limit), and trees grow back.

The objective: among the steps whose forward time keeps every pending request on time, the one with
the most expected tokens per second (``budget.split_budget`` on the decodes' gains). Pending request i
(prefill order) still has ``tokens_i`` prompt tokens and ``slack_i`` seconds until its target; with
``chunk`` prompt tokens prefilled per step it needs steps_i = ceil((tokens_1 + ... + tokens_i) / chunk)
more steps, so every step may last at most T_i = slack_i / steps_i. The step may last
T = min_i T_i, and carries at most the largest n with cost(n) <= T tokens (never fewer than ``floor``:
the prefill chunks and one root per decode). A request already late (slack <= 0) gets ``floor``:
no trees until it has its first token.

Worked example: cost(n) = 0.040 + 0.0024 n seconds, 15 requests decoding and one prefill chunk of 256
this step (floor 271), at most 512 tokens a forward. Pending: A with 300 prompt tokens left and 1.5 s
of slack, then B with 400 and 3.9 s. A needs ceil(300 / 256) = 2 steps: T_A = 0.75 s; B needs
ceil(700 / 256) = 3: T_B = 1.3 s. T = 0.75 s, so n <= (0.75 - 0.040) / 0.0024 = 295.8: the ceiling
is 295 and the 15 trees share 24 draft tokens (without A and B waiting they could take 241).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A request still prefilling, in prefill order."""

    tokens: int  # prompt tokens not yet in its cache (this step's chunk included)
    slack_s: float  # seconds until its first token is due (<= 0: already late)


def step_seconds(pending: Sequence[Pending], chunk: int) -> float:
    """Longest a step may last so that every pending request still meets its target (inf: none pending;
    0.0: one is already late)."""
    if chunk <= 0:
        raise ValueError("chunk must be > 0")
    limit = math.inf
    queued = 0  # prompt tokens ahead of and including this request
    for p in pending:
        queued += p.tokens
        if p.slack_s <= 0:
            return 0.0
        limit = min(limit, p.slack_s / math.ceil(queued / chunk))
    return limit


def largest_within(cost: Callable[[int], float], seconds: float, floor: int, ceiling: int) -> int:
    """The largest n in [floor, ceiling] with cost(n) <= seconds (``cost`` non-decreasing); ``floor``
    when even that costs more."""
    if cost(ceiling) <= seconds:
        return ceiling
    lo, hi = floor, ceiling  # cost(hi) > seconds throughout; lo is the answer once cost(lo) <= seconds
    if cost(lo) > seconds:
        return floor
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) <= seconds:
            lo = mid
        else:
            hi = mid
    return lo


def share_ceiling(cost: Callable[[int], float], floor: int, max_tokens: int, share: float) -> int:
    """Most tokens a step of ``floor`` tokens of prefill chunks and roots may carry (in [floor, max_tokens]) so
    that its trees add at most ``share`` of its own cost: while prompts prefill, a request's first token
    comes about as soon as it would without speculation. ``share`` inf: ``max_tokens``.

    Example: cost(n) = 0.040 + 0.001 n seconds, a 256-token chunk and 3 roots (floor 259, cost 0.299 s),
    share 0.05: the step may last 0.31395 s, so it carries 273 tokens: 14 for the three trees."""
    if math.isinf(share) or floor >= max_tokens:
        return max(floor, max_tokens)
    return largest_within(cost, (1.0 + share) * cost(floor), floor, max_tokens)


def step_ceiling(pending: Sequence[Pending], chunk: int, floor: int, max_tokens: int,
                 cost: Callable[[int], float]) -> int:
    """Most tokens this step may carry (in [floor, max_tokens]) so that every pending request meets its
    TTFT target; ``max_tokens`` when none is pending. See the module docstring for an example."""
    if not pending:
        return max(floor, max_tokens)
    if floor >= max_tokens:
        return floor
    seconds = step_seconds(pending, chunk)
    if seconds <= 0:
        return floor
    return largest_within(cost, seconds, floor, max_tokens)
