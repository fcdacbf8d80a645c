"""Draft budgets that adapt to load: how many draft tokens each request sends with the next forward.

A request sending q draft tokens (plus its root) emits gains[q] tokens on average; the forward
carrying every request costs cost(total tokens). Where one more token is nearly free (GPU, idle
CPU) budgets grow; where it costs as much as a token's worth of output (loaded CPU) they shrink to
0, which is plain decoding. Drafts are built best-first, so a tree of budget D is a prefix of a
bigger one and one run's accepted paths tell what every smaller budget would have accepted.

    gains = [expected_tokens(paths_a, 16), expected_tokens(paths_b, 16)]   # or gains.GainsModel
    budgets = split_budget(gains, kernels.curve.cost, base_tokens=0, max_tokens=64)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def accepted_within(path: Sequence[int], budget: int) -> int:
    """Nodes of an accepted ``path`` that a tree of ``budget`` draft tokens would also have accepted.

    ``path``: the accepted flattened node indices after the root (1-based, increasing along the
    path); a budget-D tree holds nodes 1..D, so acceptance stops at the first index past D.
    Example: path (1, 2, 5, 9): budget 0 -> 0, 2 -> 2, 4 -> 2, 5 -> 3, 9 -> 4.
    """
    n = 0
    for index in path:
        if index > budget:
            break
        n += 1
    return n


def _padded(prior: Sequence[float] | None, size: int) -> list[float]:
    """``prior`` cut or padded (with its last value) to ``size`` entries, made non-decreasing; 1.0s if None."""
    values = list(prior) if prior else [1.0]
    values = (values + [values[-1]] * size)[:size]
    out: list[float] = []
    for v in values:
        out.append(max(v, out[-1]) if out else v)
    return out


def expected_tokens(
    paths: Sequence[Sequence[int]], max_budget: int, prior: Sequence[float] | None = None
) -> list[float]:
    """Mean tokens a step emits with q draft tokens, for q = 0..max_budget (1 + accepted_within).

    ``paths``: a request's recent steps (accepted node indices each), drafted with a budget of at
    least ``max_budget`` (a smaller tree says nothing past its size: ``gains.GainsModel`` handles
    mixed sizes); none -> ``prior`` (e.g. the engine-wide average; 1.0 everywhere if None), padded
    with its last value. Non-decreasing in q.
    Example: paths [(1, 2), (1, 3)], max_budget 3 -> [1.0, 2.0, 2.5, 3.0]; no paths and prior
    [1.0, 1.5], max_budget 3 -> [1.0, 1.5, 1.5, 1.5].
    """
    if not paths:
        return _padded(prior, max_budget + 1)
    out: list[float] = []
    for q in range(max_budget + 1):
        mean = sum(1 + accepted_within(path, q) for path in paths) / len(paths)
        out.append(max(mean, out[-1]) if out else mean)
    return out


LOOKAHEAD = 4  # draft tokens a single move may add (gains can be flat for a token or two, then rise)


def split_budget(
    gains: Sequence[Sequence[float]],
    cost: Callable[[int], float],
    base_tokens: int,
    max_tokens: int,
    lookahead: int = LOOKAHEAD,
) -> list[int]:
    """Draft tokens per request maximizing tokens emitted per second of the shared forward.

    ``gains[b][q]``: expected tokens request b emits with q draft tokens (``gains[b][0]`` ~ 1.0);
    request b sends 1 + q_b tokens and the forward also carries ``base_tokens`` (a prefill chunk):
    maximize sum_b gains[b][q_b] / cost(base_tokens + sum_b (1 + q_b)) with that total <= max_tokens.
    Greedy from all-zero (plain decoding): among the moves of 1..``lookahead`` tokens to one request
    that raise throughput, take the best gain per token; stop when none does. So the result is never
    worse than speculation off under ``cost``. Example, gains a = [1.0, 1.8, 2.3, 2.5],
    b = [1.0, 1.3, 1.4, 1.4], base 0, max 16:
        cost(n) = 10 + n (fixed overhead, cheap tokens) -> [2, 1]: 3.6 tokens / 15 = 0.24 (off: 2 / 12)
        cost(n) = 10     (flat, GPU-like)               -> [3, 2]: every gain taken
        cost(n) = n      (each token costs a forward)   -> [0, 0]: plain decoding
    """
    if base_tokens + len(gains) > max_tokens:
        raise ValueError("base_tokens + one token per request exceeds max_tokens")
    budgets = [0] * len(gains)
    total = base_tokens + len(gains)  # tokens in the forward
    emitted = sum(g[0] for g in gains)
    throughput = emitted / cost(total)
    while True:
        move: tuple[float, int, int] | None = None  # (gain per token, request, tokens added)
        for k in range(1, lookahead + 1):
            if total + k > max_tokens:
                break
            forward = cost(total + k)
            for b, g in enumerate(gains):
                q = budgets[b]
                if q + k >= len(g):
                    continue
                gain = g[q + k] - g[q]
                if (emitted + gain) / forward > throughput and (move is None or gain / k > move[0]):
                    move = (gain / k, b, k)
        if move is None:
            return budgets
        _, b, k = move
        emitted += gains[b][budgets[b] + k] - gains[b][budgets[b]]
        budgets[b] += k
        total += k
        throughput = emitted / cost(total)
