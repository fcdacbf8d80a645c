"""``lookahead-rag-bench prompt-order``'s PNG: per passage order, the prefix-cache hits (share of prompt
tokens, and tokens per prompt) and the answers' SQuAD exact match and F1, values on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import TITLE_FONT, figure, grouped_bars, known, save, title

PERCENT = 100.0
HITS = {"hit_fraction": "prefix-hit tokens / prompt tokens"}
TOKENS = {"mean_hit_tokens": "prefix-hit tokens per prompt", "mean_prompt_tokens": "prompt tokens per prompt"}
QUALITY = {"exact_match": "exact match", "f1": "F1"}


def plot(data: dict[str, Any], path: str) -> None:
    """Three panels over the orders measured: hit share (%), tokens per prompt, EM and F1 (%)."""
    orders = data.get("orders") or {}
    names = list(orders)
    fig, (share, tokens, quality) = figure(3)

    def series(keys: dict[str, str], scale: float = 1.0) -> dict[str, list[float | None]]:
        return {label: [None if orders[o].get(k) is None else orders[o][k] * scale for o in names]
                for k, label in keys.items()}

    grouped_bars(share, names, series(HITS, PERCENT), lambda v: f"{v:.1f}%")
    share.set_ylabel("% of all prompt tokens")
    share.set_title("what a prefix cache that never evicts reuses", fontsize=TITLE_FONT)
    grouped_bars(tokens, names, series(TOKENS), lambda v: f"{v:.0f}")
    tokens.set_ylabel("tokens (mean per prompt)")
    tokens.set_title("prefix hits beside prompt length", fontsize=TITLE_FONT)
    grouped_bars(quality, names, series(QUALITY), lambda v: f"{v:.1f}")
    quality.set_ylabel("SQuAD score (%), max over reference answers")
    quality.set_title(f"greedy answers, {known(data.get('max_new_tokens'))} new tokens at most", fontsize=TITLE_FONT)
    for ax in (share, tokens, quality):
        ax.set_xlabel("order of the kept passages in the prompt")
    what = (f"Passage order: prefix-cache sharing and answer quality, {known(data.get('questions'))} questions, "
            f"{known(data.get('tenants'))} tenant(s)\ndata: {known(data.get('dataset'))}")
    save(fig, path, title(data, what, "score order (best passage first), the same passages kept"))
