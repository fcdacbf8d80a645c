"""bench hog's PNG: the victim's goodput, TTFT p50, prefix-hit tokens and tokens per step, alone (the baseline)
and beside the hog, the value on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, known, save, title

PANELS = (("goodput_tokens_per_s", "victim goodput (tokens of completed requests / s)"),
          ("ttft_p50_s", "victim time to first token, p50 (s)"),
          ("prefix_hit_tokens", "victim prefix-cache hit tokens (sum)"),
          ("mean_accepted_per_step", "victim tokens per step"))


def plot(data: dict[str, Any], path: str) -> None:
    """One panel per figure, one bar per run."""
    runs = data["runs"]
    fig, axes = figure(len(PANELS))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        grouped_bars(ax, ["victim"], {way: [run.get(key)] for way, run in runs.items()})
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
    hog = runs.get("hog", {})
    targets = data.get("targets", {})
    what = (f"one tenant at its worst: {known(data.get('hog_streams'))} streams of "
            f"{known(hog.get('hog_prompt_tokens'))}-token prompts beside {known(data.get('requests'))} victim "
            f"requests x {known(data.get('concurrency'))} clients\nprefix hits kept "
            f"{known(targets.get('prefix_hits_kept'))} (target >= 0.9), TTFT p50 rise "
            f"{known(targets.get('ttft_p50_rise_chunks'))} prefill chunks (target <= 1)")
    save(fig, path, title(data, what, "the victim alone on a fresh stack (plain)"))
