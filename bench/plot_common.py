"""What every benchmark PNG shares: the title (model, machine, threads, baseline) and value labels.

Plots read only the result JSON, so a PNG can be redrawn from an old file (``lookahead-rag-bench
plot``); a field the file lacks shows as ``unknown``, never as a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

UNKNOWN = "unknown"  # what a title shows for a field the JSON does not record
DPI = 110
LABEL_FONT = 8  # value labels on bars and points
TITLE_FONT = 9
LABEL_PAD = 2  # points between a bar and its label
Y_MARGIN = 0.15  # head room above the tallest bar for its label
PANEL_WIDTH_IN = 6.0  # figure width per panel, inches
PANEL_HEIGHT_IN = 5.0
MIN_WIDTH_IN = 9.0  # a one-panel figure still fits its title lines
ONE_DECIMAL_FROM = 10.0  # labels: two decimals below this, one from it
NO_DECIMALS_FROM = 100.0  # ... and none from this
GROUP_WIDTH = 0.8  # of a cluster of grouped bars, in x units (one unit between groups)


def known(value: Any) -> str:
    """The value as text, or ``unknown`` when the JSON has none."""
    return UNKNOWN if value is None or value == "" else str(value)


def machine_label(data: dict[str, Any]) -> str:
    """The machine a run measured: the GPU's name when it ran on CUDA, else the CPU model and the host."""
    device = str(data.get("device") or "")
    if device.startswith("cuda"):
        name = device.partition("(")[2].rstrip(")") or None
        return f"GPU {known(name)}"
    host = data.get("machine") or device or None
    return f"CPU {known(data.get('cpu'))}, {known(host)}"


def title(data: dict[str, Any], what: str, baseline: str, threads: Any = None, model: Any = None) -> str:
    """Three lines: what was measured; model, machine and threads; the baseline."""
    model = data.get("model") if model is None else model
    if model is not None and data.get("weights"):  # the products' format: a GGUF's block types, int8 or a dtype
        kv = f", {data['kv_dtype']} KV" if data.get("kv_dtype") else ""  # the request caches' dtype, where recorded
        model = f"{model} ({data['weights']} weights{kv})"
    threads = data.get("threads") if threads is None else threads
    return f"{what}\nmodel {known(model)} | {machine_label(data)} | threads {known(threads)}\nbaseline: {baseline}"


def fmt_value(value: float) -> str:
    """A label: two decimals under 10, one under 100, none from 100."""
    if abs(value) >= NO_DECIMALS_FROM:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= ONE_DECIMAL_FROM else f"{value:.2f}"


def label_bars(ax: Any, bars: Any, values: Sequence[float | None],
               fmt: Callable[[float], str] = fmt_value) -> None:
    """The value on top of every bar (``n/a`` where the JSON has none)."""
    ax.bar_label(bars, labels=["n/a" if v is None else fmt(v) for v in values], fontsize=LABEL_FONT,
                 padding=LABEL_PAD)
    ax.margins(y=Y_MARGIN)


def label_points(ax: Any, xs: Sequence[float], ys: Sequence[float], color: str,
                 offset: tuple[int, int] = (0, 6), fmt: Callable[[float], str] = fmt_value) -> None:
    """The value next to every point of a line, ``offset`` points away."""
    for x, y in zip(xs, ys, strict=True):
        ax.annotate(fmt(y), (x, y), textcoords="offset points", xytext=offset, ha="center",
                    fontsize=LABEL_FONT, color=color)


def figure(panels: int) -> tuple[Any, list[Any]]:
    """A headless figure with ``panels`` side-by-side axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(PANEL_WIDTH_IN * panels, MIN_WIDTH_IN)
    fig, axes = plt.subplots(1, panels, figsize=(width, PANEL_HEIGHT_IN), squeeze=False)
    return fig, list(axes[0])


def save(fig: Any, path: str, suptitle: str) -> None:
    """Title the figure, write the PNG, free it."""
    import matplotlib.pyplot as plt

    fig.suptitle(suptitle, fontsize=TITLE_FONT)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float | None]],
                 fmt: Callable[[float], str] = fmt_value) -> None:
    """One cluster of bars per group, one bar per series (legend), the value on every bar."""
    width = GROUP_WIDTH / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=name)
        label_bars(ax, bars, values, fmt)
    ax.set_xticks(range(len(groups)), groups)
    ax.legend(fontsize=LABEL_FONT)
