"""bench-serve's PNG: goodput and TTFT p99 against concurrency, one line per way, values on the points."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import UNKNOWN, Y_MARGIN, figure, fmt_value, known, label_points, save, title

PANELS = (("goodput_tokens_per_s", "goodput (tokens of completed requests / s)"),
          ("ttft_p99_s", "time to first token, p99 (s, client-side)"))
# way -> (colour, marker, label offset in points: staggered so close values stay readable)
X_MARGIN = 0.08  # room left and right of the outer levels for their labels
WAY_STYLE = {"on": ("tab:blue", "o", (-16, 7)), "on_tls": ("tab:green", "D", (-16, -15)),
             "on_safe": ("tab:purple", "v", (16, -15)), "off": ("tab:orange", "s", (0, -15)),
             "serial_hf": ("tab:gray", "^", (16, 7))}


def _baseline(data: dict[str, Any]) -> str:
    if data.get("serial_baseline") == "reference_sampler":
        top_k = f", top-k {data['top_k']}" if data.get("top_k") else ""
        return (f"reference sampler (T={data['temperature']:g}, top-p {data['top_p']:g}{top_k}, "
                f"seed {data['seed']} for every request)")
    if data.get("serial_baseline") is None:  # files from before the baseline was recorded
        return f"transformers generate (greedy or sampled: {UNKNOWN}, not recorded)"
    return "transformers generate, greedy"


def plot(data: dict[str, Any], path: str) -> None:
    """Goodput and TTFT p99 against concurrency, one line per way, the value at every point."""
    levels = sorted(data["levels"], key=int)
    ways = [w for w in WAY_STYLE if any(w in data["levels"][c] for c in levels)]
    fig, axes = figure(len(PANELS))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for way in ways:
            pts = [(int(c), data["levels"][c][way][key]) for c in levels
                   if way in data["levels"][c] and data["levels"][c][way].get(key) is not None]
            if not pts:
                continue
            color, marker, offset = WAY_STYLE[way]
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker=marker, color=color, label=way)
            label_points(ax, xs, ys, color, offset, fmt_value)
        ax.set_xscale("log", base=2)
        ax.set_xticks([int(c) for c in levels], [str(c) for c in levels])
        ax.set_xlabel("concurrent clients (closed loop, count)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.margins(x=X_MARGIN, y=Y_MARGIN)
        ax.legend()
    legend = "; on_tls = on over TLS, on_safe = on with the side-channel-safe stream" if (
        {"on_tls", "on_safe"} & set(ways)) else ""
    r = data.get("replay")
    replayed = f" (the same prompts: c={r['level']} {r['way']} of {r['file']})" if r else ""
    what = (f"Serving: {' vs '.join(ways)}{legend}\n"
            f"{known(data.get('requests'))} requests a level{replayed}, "
            f"Zipf {known(data.get('zipf'))}, pool {known(data.get('pool'))}, "
            f"{known(data.get('max_new_tokens'))} new tokens\ndata: {known(data.get('dataset'))}")
    save(fig, path, title(data, what, f"serial_hf = {_baseline(data)}, batch 1, one request at a time"))
