"""Forward cost against the number of tree tokens, and the decoding length it calls for."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
from lookahead_core.draft import DraftTree
from lookahead_core.kvcache import rollback_cache
from lookahead_core.tree_inputs import build_tree_inputs
from transformers import DynamicCache, PreTrainedModel

TREE_SIZES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 64)  # tokens per verification forward measured
REPEATS = 7  # forwards per size; the median is kept


def measure_forward_cost(
    model: PreTrainedModel, past_len: int, sizes: Sequence[int] = TREE_SIZES, repeats: int = REPEATS
) -> dict[int, float]:
    """Median milliseconds of one verification forward of q tokens over a past_len-token cache."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, past_len), generator=gen).to(device)  # [1, past]
    cache = DynamicCache()
    out: dict[int, float] = {}
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for q in sizes:
            tree = DraftTree()
            for i in range(q - 1):  # a chain with a fork every 4 nodes: shape does not change the cost
                tree.add(0 if i % 4 == 0 else len(tree), int(torch.randint(0, vocab, (1,), generator=gen)),
                         merge=False)
            inputs = build_tree_inputs(tree, 0, past_len, dtype, device)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                model(
                    input_ids=inputs.input_ids,
                    position_ids=inputs.position_ids,
                    attention_mask=inputs.attention_mask,
                    past_key_values=cache,
                    use_cache=True,
                )
                times.append(time.perf_counter() - t0)
                rollback_cache(cache, past_len)
            out[q] = statistics.median(times[1:]) * 1000.0  # first call warms up
    return out


def expected_tokens(paths: Sequence[Sequence[int]], budget: int) -> float:
    """Mean tokens per step had the tree held only its first ``budget`` nodes (+1 bonus token).

    Valid for best-first trees, whose smaller-budget versions are prefixes of the bigger one.
    """
    if not paths:
        return 1.0
    return sum(1 + sum(1 for i in path if i <= budget) for path in paths) / len(paths)


def choose_decoding_length(cost_ms: dict[int, float], paths: Sequence[Sequence[int]]) -> tuple[int, dict]:
    """The draft budget maximizing expected tokens per millisecond, from measured costs and acceptances.

    Tree of budget D runs D + 1 tokens (root included); the cost is interpolated between measured sizes.
    """
    sizes = sorted(cost_ms)

    def cost(q: int) -> float:
        lo = max((s for s in sizes if s <= q), default=sizes[0])
        hi = min((s for s in sizes if s >= q), default=sizes[-1])
        if hi == lo:
            return cost_ms[lo]
        return cost_ms[lo] + (cost_ms[hi] - cost_ms[lo]) * (q - lo) / (hi - lo)

    table = {}
    for budget in range(0, sizes[-1]):
        tokens = expected_tokens(paths, budget)
        table[budget] = {"tokens_per_step": tokens, "ms_per_step": cost(budget + 1),
                         "tokens_per_ms": tokens / cost(budget + 1)}
    best = max(table, key=lambda b: table[b]["tokens_per_ms"])
    return best, table
