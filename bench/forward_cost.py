"""Forward cost against the number of tree tokens, and the decoding length it calls for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookahead_core.engine.budget import expected_tokens
from lookahead_core.forward.kernels import CostCurve, KernelSet
from lookahead_core.forward.probe import RaggedProbe
from lookahead_core.kv.kvstore import KVShape

TREE_SIZES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 64)  # tokens per verification forward measured
REPEATS = 7  # timed forwards per kernel and size; the median is kept (one untimed round first)


def measure_forward_cost(
    kernels: KernelSet, past_len: int, sizes: Sequence[int] = TREE_SIZES, repeats: int = REPEATS
) -> CostCurve:
    """Calibrate ``kernels`` on the engine's forwards of each size over a ``past_len``-token cache.

    Every kernel is timed (``kernels.measured``, seconds); the returned curve holds the kernels kept,
    the cheapest of which runs each forward.
    """
    shape = KVShape.of(next(iter(kernels.twins.values())))
    return kernels.calibrate(RaggedProbe(shape, past_len), sizes, repeats)


def choose_decoding_length(curve: CostCurve, paths: Sequence[Sequence[int]]) -> tuple[int, dict[int, Any]]:
    """The draft budget maximizing expected tokens per millisecond, from measured costs and acceptances.

    A tree of budget D runs D + 1 tokens (root included); ``paths`` are the accepted paths of a run
    with the widest budget (best-first trees: smaller budgets are prefixes, see budget.py).
    """
    max_budget = curve.token_counts[-1] - 1
    tokens = expected_tokens(paths, max_budget)
    table = {}
    for budget in range(max_budget + 1):
        ms = curve.cost(budget + 1) * 1000.0
        table[budget] = {"tokens_per_step": tokens[budget], "ms_per_step": ms, "tokens_per_ms": tokens[budget] / ms}
    best = max(table, key=lambda b: table[b]["tokens_per_ms"])
    return best, table
