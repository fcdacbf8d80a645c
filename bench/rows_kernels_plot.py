"""The tree-kernel benchmark's PNG (``bench/rows_kernels.py``), drawn from its result JSON."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, save, title

BASELINE = "avx2"  # the kernel the others are compared with


def plot(data: dict[str, Any], path: str) -> None:
    """Grouped bars: ms for every product of the model at each size, one bar per kernel, value labels."""
    fig, (ax,) = figure(1)
    sizes = [str(m) for m in data["sizes"]]
    grouped_bars(ax, sizes, {name: [by.get(m) for m in sizes] for name, by in data["ms"].items()})
    ax.set_xlabel("rows per product (tree tokens)")
    ax.set_ylabel("ms for every product of the model")
    save(fig, path, title(data, "Every product of the model at each tree size", f"the {BASELINE} rows kernel"))
