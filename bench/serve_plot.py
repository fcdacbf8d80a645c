"""bench-serve's PNG: goodput and TTFT p99 against concurrency, one line per way, values on the points."""

from __future__ import annotations

from typing import Any

PANELS = (("goodput_tokens_per_s", "goodput (tokens/s)"), ("ttft_p99_s", "TTFT p99 (s)"))
# way -> (colour, marker, label offset in points: staggered so close values stay readable)
WAY_STYLE = {"on": ("tab:blue", "o", (-16, 7)), "off": ("tab:orange", "s", (0, -15)),
             "serial_hf": ("tab:gray", "^", (16, 7))}


def _label(y: float) -> str:
    return f"{y:.1f}" if abs(y) >= 10 else f"{y:.2f}"


def _baseline(data: dict[str, Any]) -> str:
    if data.get("serial_baseline") == "reference_sampler":
        top_k = f", top-k {data['top_k']}" if data.get("top_k") else ""
        return (f"reference sampler (T={data['temperature']:g}, top-p {data['top_p']:g}{top_k}, "
                f"seed {data['seed']} for every request)")
    return "transformers generate, greedy"


def plot(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(data["levels"], key=int)
    ways = [w for w in WAY_STYLE if any(w in data["levels"][c] for c in levels)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for way in ways:
            pts = [(int(c), data["levels"][c][way][key]) for c in levels
                   if way in data["levels"][c] and data["levels"][c][way][key] is not None]
            if not pts:
                continue
            color, marker, offset = WAY_STYLE[way]
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker=marker, color=color, label=way)
            for x, y in pts:
                ax.annotate(_label(y), (x, y), textcoords="offset points", xytext=offset, ha="center",
                            fontsize=8, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks([int(c) for c in levels], [str(c) for c in levels])
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.margins(x=0.08, y=0.12)
        ax.legend()
    fig.suptitle(f"{data['model']} on {data['device']} ({data['cpu']}; {data['machine']}), threads={data['threads']}; "
                 f"{data['requests']} requests, Zipf {data['zipf']}, pool {data['pool']}, "
                 f"{data['max_new_tokens']} new tokens\nbaseline serial_hf: {_baseline(data)}, "
                 "batch 1, one request at a time", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
