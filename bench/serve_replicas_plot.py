"""bench serve --replicas's PNG: per concurrency level, goodput, TTFT p50, prefix-hit tokens and tokens per
step side by side for each routing (round robin = the baseline), the value on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, known, save, title

PANELS = (("goodput_tokens_per_s", "goodput (tokens of completed requests / s)"),
          ("ttft_p50_s", "time to first token, p50 (s, client-side)"),
          ("prefix_hit_tokens", "prefix-cache hit tokens (sum over requests)"),
          ("mean_accepted_per_step", "tokens per step (accepted, mean)"))


def plot(data: dict[str, Any], path: str) -> None:
    """One panel per figure, one cluster per level, one bar per routing."""
    levels = sorted(data["levels"], key=int)
    routings = list(dict.fromkeys(r for c in levels for r in data["levels"][c]))
    fig, axes = figure(len(PANELS))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        series = {r: [data["levels"][c].get(r, {}).get(key) for c in levels] for r in routings}
        grouped_bars(ax, [f"c={c}" for c in levels], series)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    what = (f"{known(data.get('replicas'))} generator replicas x {known(data.get('threads_per_replica'))} thread(s) "
            f"behind {known(data.get('proxy'))}: routing by tenant vs round robin\n"
            f"{known(data.get('requests'))} replayed requests, {known(data.get('tenants'))} tenants, "
            f"{known(data.get('max_new_tokens'))} new tokens, bus {known(data.get('bus'))}")
    save(fig, path, title(data, what, f"{known(data.get('baseline'))} (each call to the next replica)"))
