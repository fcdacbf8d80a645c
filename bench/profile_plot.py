"""The step profile as stacked bars: milliseconds per step by phase, one bar per mode or load level.

    plot(data, path)   # data["profile"]: {label: StepProfile.report()} (bench decoding / serve --profile)
"""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import LABEL_FONT, figure, fmt_value, save, title

MIN_LABELLED_SHARE = 0.04  # segments thinner than this share of the tallest bar carry no label (the total shows)
LABEL_ROTATION = 25  # degrees: the bars' names (mode or way@clients and phase) slant so they never overlap


def stacked(ax: Any, labels: list[str], phases: list[str], ms: dict[str, list[float]]) -> None:
    """One bar per label, one segment per phase (legend), each segment's ms inside it, the total on top."""
    bottoms = [0.0] * len(labels)
    tallest = max((sum(ms[p][i] for p in phases) for i in range(len(labels))), default=0.0)
    for phase in phases:
        values = ms[phase]
        bars = ax.bar(labels, values, bottom=bottoms, label=phase)
        ax.bar_label(bars, labels=[fmt_value(v) if v >= MIN_LABELLED_SHARE * tallest else "" for v in values],
                     label_type="center", fontsize=LABEL_FONT)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for x, total in enumerate(bottoms):
        ax.annotate(f"{fmt_value(total)} ms", (x, total), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize=LABEL_FONT)
    ax.set_ylabel("ms per step")
    ax.tick_params(axis="x", labelrotation=LABEL_ROTATION, labelsize=LABEL_FONT)
    ax.margins(y=0.12)
    ax.legend(fontsize=LABEL_FONT, ncol=2)


def floor_marks(ax: Any, reports: dict[str, dict[str, Any]]) -> None:
    """A black tick across each bar at its forward's bandwidth floor (runs whose report has one)."""
    floors = [(x, (r.get("floor") or {}).get("floor_ms")) for x, r in enumerate(reports.values())]
    marked = [(x, f) for x, f in floors if f]
    for i, (x, floor) in enumerate(marked):
        ax.hlines(floor, x - 0.4, x + 0.4, colors="black", linewidths=2, label="bandwidth floor" if i == 0 else None)
    if marked:
        ax.legend(fontsize=LABEL_FONT, ncol=2)


def plot(data: dict[str, Any], path: str) -> None:
    reports: dict[str, dict[str, Any]] = data["profile"]
    labels = list(reports)
    phases = list(next(iter(reports.values()))["ms_per_step"]) if reports else []
    ms = {p: [float(reports[label]["ms_per_step"][p]) for label in labels] for p in phases}
    fig, (ax,) = figure(1)
    stacked(ax, [f"{label} ({reports[label]['tokens_per_forward']:.0f} tok/fwd)" for label in labels], phases, ms)
    floor_marks(ax, reports)
    save(fig, path, title(data, "Where a step's time goes (engine step profile)",
                          "phases of the same engine's steps; 'other' is engine time outside any step phase; "
                          "black tick: the forward's bandwidth floor (weights + KV read / measured GB/s)"))
