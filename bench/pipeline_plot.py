"""The PNG of ``decoding --via-grpc`` (its JSON has ``"pipeline"``): what the gRPC hops cost.

Left: the end-to-end wall time to answer every question in-process and through the three gRPC
services on loopback. Middle: per question, the gRPC overhead (the difference, averaged) next to
the retrieval latency (p50, p99) for scale. Right: the decoding speedups of the same run.
"""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.decoding_plot import REFERENCE, baseline_label, speedup_panel
from lookahead_rag.bench.plot_common import TITLE_FONT, figure, known, label_bars, save, title

MS_PER_S = 1000.0
PERCENT = 100.0
WAY_COLORS = ("tab:green", "tab:purple")  # in-process, gRPC
PER_QUESTION_COLORS = ("tab:purple", "tab:olive", "tab:olive")  # overhead, retrieve p50, retrieve p99


def per_question_overhead_ms(data: dict[str, Any]) -> float | None:
    """(gRPC wall - in-process wall) / questions, in ms: what the hops add to one answer."""
    p, n = data["pipeline"], data.get("questions")
    if not n or p.get("grpc_wall_s") is None or p.get("in_process_wall_s") is None:
        return None
    return (p["grpc_wall_s"] - p["in_process_wall_s"]) / n * MS_PER_S


def _walls(ax: Any, data: dict[str, Any]) -> None:
    p = data["pipeline"]
    values = [p.get("in_process_wall_s"), p.get("grpc_wall_s")]
    bars = ax.bar(["in-process\n(direct calls)", "three gRPC services\n(loopback)"],
                  [v or 0.0 for v in values], color=WAY_COLORS)
    label_bars(ax, bars, values, lambda v: f"{v:.2f} s")
    frac, same = p.get("overhead_frac"), p.get("same_outputs")
    ax.set_ylabel("wall time to answer every question (s, client side)")
    ax.set_title(f"end to end: {known(data.get('questions'))} questions, "
                 f"{known(data.get('max_new_tokens'))} new tokens each\n"
                 f"gRPC overhead {'n/a' if frac is None else f'{frac * PERCENT:+.1f}%'}, "
                 f"same outputs {'n/a' if same is None else f'{same:.2f}'}", fontsize=TITLE_FONT)


def _per_question(ax: Any, data: dict[str, Any]) -> None:
    r = data.get("retrieval") or {}
    values = [per_question_overhead_ms(data), r.get("p50_ms"), r.get("p99_ms")]
    bars = ax.bar(["gRPC overhead\n(mean, gRPC - in-process)", "retrieve p50\n(embed + search)", "retrieve p99"],
                  [v or 0.0 for v in values], color=PER_QUESTION_COLORS)
    label_bars(ax, bars, values, lambda v: f"{v:.1f} ms")
    ax.set_ylabel("time per question (ms)")
    ax.set_title(f"per question; retrieval over {known(r.get('chunks'))} chunks, in-process", fontsize=TITLE_FONT)


def plot(data: dict[str, Any], path: str) -> None:
    """Wall time in-process vs gRPC, the per-question overhead vs retrieval, and the run's speedups."""
    ref = REFERENCE if data.get("baseline") == REFERENCE else "greedy"
    fig, (a, b, c) = figure(3)
    _walls(a, data)
    _per_question(b, data)
    speedup_panel(c, data, ref)
    c.set_title("decoding in the same run (engine, no services)", fontsize=TITLE_FONT)
    what = f"Pipeline overhead: the same questions in-process vs over gRPC; data: {known(data.get('dataset'))}"
    save(fig, path, title(data, what, f"overhead: the in-process pipeline; speedups: {baseline_label(data)}"))
