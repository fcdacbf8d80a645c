"""bench replica-sim's PNG: prefix-hit fraction, goodput and TTFT p99 against the replica count, one line
per routing policy (round robin = the baseline), and the replicas each needs per 1,000 requests/s."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, known, label_points, save, title

PANELS = (("hit_fraction", "prefix-hit fraction of prompt tokens"),
          ("goodput_tokens_per_s", "goodput (answer tokens / s, all replicas)"),
          ("ttft_p99_s", "time to first token, p99 (s)"))
STYLE = {"round_robin": ("tab:gray", "o"), "tenant": ("tab:blue", "s"), "bounded": ("tab:green", "^")}


def plot(data: dict[str, Any], path: str) -> None:
    counts = sorted(data["runs"], key=int)
    fig, axes = figure(len(PANELS) + 1)
    for ax, (key, label) in zip(axes, PANELS, strict=False):
        for policy, (color, marker) in STYLE.items():
            xs = [int(r) for r in counts if policy in data["runs"][r]]
            ys = [data["runs"][str(r)][policy][key] for r in xs]
            ax.plot(xs, ys, marker=marker, color=color, label=policy)
            label_points(ax, xs, ys, color)
        ax.set_xscale("log")
        if key == "ttft_p99_s":  # unbounded hashing's queue is orders of magnitude past the others
            ax.set_yscale("log")
        ax.set_xticks([int(r) for r in counts], counts)
        ax.set_xlabel("replicas (count)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    need = data["replicas_per_1000_rps"]
    grouped_bars(axes[-1], ["per 1,000 req/s"], {p: [need.get(p)] for p in STYLE})
    axes[-1].set_ylabel(f"replicas for TTFT p99 <= {known(data.get('ttft_p99_target_s'))} s (count)")
    what = (f"Simulated replicas: {known(data.get('tenants'))} tenants, Zipf {known(data.get('zipf'))}, "
            f"{known(data.get('load_per_replica'))} req/s per replica, prefix cache "
            f"{known(data.get('cache_tenants'))} tenants/replica\ncosts measured: {known(data.get('costs_from'))}")
    save(fig, path, title(data, what, "round_robin (each call to the next replica)"))
