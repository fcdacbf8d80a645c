"""The attention benchmark's PNG (``bench/attention_kernels.py``), drawn from its result JSON."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, save, title

BASELINE = "sdpa"  # the way the others are compared with


def plot(data: dict[str, Any], path: str) -> None:
    """Grouped bars: ms of one forward's attention (every layer) at each case, one bar per way, value labels."""
    fig, (ax,) = figure(1)
    cases = list(data["cases"])
    grouped_bars(ax, cases, {name: [by.get(c) for c in cases] for name, by in data["ms"].items()})
    ax.set_xlabel("the forward's segments")
    ax.set_ylabel("ms of attention, every layer")
    ax.tick_params(axis="x", labelrotation=20)
    save(fig, path, title(data, "Attention of one forward's segments", BASELINE))
