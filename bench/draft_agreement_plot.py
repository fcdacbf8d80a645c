"""``lookahead-rag-bench draft-agreement``'s PNG: per exit layer, top-1 agreement with the target and the
draft's one-token cost against the target's, values on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import TITLE_FONT, figure, grouped_bars, known, save, title

SERIES = {"agreement": "top-1 agreement with the target", "cost_vs_target": "one-token cost / target's"}


def plot(data: dict[str, Any], path: str) -> None:
    """Agreement and relative cost side by side for every exit layer measured."""
    exits = data.get("exits") or []
    fig, (ax,) = figure(1)
    groups = [f"{e['layers']} of {known(data.get('target_layers'))}" for e in exits]
    grouped_bars(ax, groups, {label: [e.get(key) for e in exits] for key, label in SERIES.items()},
                 lambda v: f"{v:.2f}")
    ax.set_xlabel("self-draft: first L decoder layers + the target's norm and LM head")
    ax.set_ylabel("fraction")
    ax.set_title(f"{known(data.get('tokens'))} answer tokens of {known(data.get('questions'))} questions",
                 fontsize=TITLE_FONT)
    what = f"Early-exit self-draft: agreement and cost per exit layer\ndata: {known(data.get('dataset'))}"
    save(fig, path, title(data, what, "the target model's own greedy tokens and one-token forward"))
