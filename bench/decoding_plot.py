"""``lookahead-rag-bench decoding``'s PNG: speedup per mode (values on the bars) and the forward-cost curve."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import (
    LABEL_FONT,
    TITLE_FONT,
    UNKNOWN,
    Y_MARGIN,
    figure,
    known,
    label_bars,
    label_points,
    save,
    title,
)

REFERENCE = "reference"  # the reference sampler (lookahead_core.sampling): the baseline mode when sampling
MS_PER_S = 1000.0
# offset in points of each curve's value labels (above, below, ...), so two close curves stay readable
POINT_OFFSETS = ((0, 6), (0, -12), (0, 14), (0, -20))
BAR_COLOR = "tab:blue"
BASELINE_LINE = {"color": "gray", "lw": 0.8}
TREE_LINE = {"color": "tab:red", "ls": "--", "lw": 0.8}
TREE_LINE_LABEL = {"scheduler": "tree size cap", "decoder": "chosen tree size"}  # by engine
CROWDED = 6  # more bars than this: smaller mode names under them
LOSSY = ("mjsd",)  # modes whose output may differ from greedy's (lookahead_core.config.LOSSY_MODES; no torch here)


def baseline_label(data: dict[str, Any]) -> str:
    """The baseline the speedups divide, in words (greedy: HF generate or the engine's one-token path)."""
    if data.get("baseline") == REFERENCE:
        top_k = f", top-k {data['top_k']}" if data.get("top_k") else ""
        return (f"reference sampler (plain sampling, T={data['temperature']:g}, top-p {data['top_p']:g}{top_k}, "
                f"seed {data['seed']} for every question)")
    which = data.get("greedy_baseline")
    if which is None:  # files from before the baseline was recorded
        return f"greedy, the 'greedy' mode (HF generate or engine one-token: {UNKNOWN})"
    which = "HF generate" if which == "hf" else "engine one-token (none)"
    return f"greedy, the faster of HF generate and none: {which}"


def _wrapped(mode: str) -> str:
    """A long mode name over lines: "hierarchical+jacobi" -> "hierarch-\\nical+\\njacobi"."""
    return mode.replace("+", "+\n").replace("hierarchical", "hierarch-\nical")


def speedup_panel(ax: Any, data: dict[str, Any], ref: str) -> None:
    """Speedup per mode against ref (value on every bar; exact match and tokens per step under its name)."""
    modes = list(data["modes"])
    rows = [data["modes"][m] for m in modes]
    values = [r.get(f"speedup_vs_{ref}") for r in rows]
    names = []
    for m, r in zip(modes, rows, strict=True):
        exact, per_step, f1 = r.get(f"exact_match_vs_{ref}"), r.get("mean_accepted_per_step"), r.get("squad_f1")
        name, unit = (_wrapped(m), "t/step") if len(modes) > CROWDED else (m, "tok/step")
        names.append("\n".join([name, *([f"exact {exact:.2f}"] if exact is not None else []),
                                *([f"{per_step:.2f} {unit}"] if per_step is not None else []),
                                *([f"F1 {f1:.0f}%"] if f1 is not None else [])]))
    bars = ax.bar(names, [v or 0.0 for v in values], color=BAR_COLOR)
    label_bars(ax, bars, values, lambda v: f"{v:.2f}x")
    if len(names) > CROWDED:
        ax.tick_params(axis="x", labelsize="x-small")
    ax.axhline(1.0, **BASELINE_LINE)
    ax.set_ylabel(f"speedup vs the {ref} baseline (x, wall time incl. prefill)")
    ax.set_xlabel("mode (exact match vs the baseline's output; tokens per forward step; SQuAD F1 of the answers)")
    ax.set_title(f"{data.get('scenario', UNKNOWN)}: {data.get('questions', UNKNOWN)} questions, "
                 f"{data.get('max_new_tokens', UNKNOWN)} new tokens, engine {known(data.get('engine'))}",
                 fontsize=TITLE_FONT)
    ax.tick_params(axis="x", labelsize=LABEL_FONT)


def _curves(data: dict[str, Any]) -> tuple[list[int], dict[str, list[float]]]:
    """Token counts and ms per forward of every timed kernel (older files: the recorded cost only)."""
    measured = (data.get("kernels") or {}).get("measured_s")
    if measured:
        ms = {k: [s * MS_PER_S for s in secs] for k, secs in measured["seconds"].items()}
        return list(measured["token_counts"]), ms
    cost = data.get("forward_cost_ms") or {}
    counts = sorted(cost, key=int)
    return [int(q) for q in counts], {"forward_cost_ms": [cost[q] for q in counts]}


def _forward_cost(ax: Any, data: dict[str, Any]) -> None:
    counts, curves = _curves(data)
    for i, (kernel, ms) in enumerate(curves.items()):
        (line,) = ax.plot(counts, ms, marker="o", label=kernel)
        label_points(ax, counts, ms, line.get_color(), POINT_OFFSETS[i % len(POINT_OFFSETS)], lambda v: f"{v:.0f}")
    if "decoding_length" in data:
        which = TREE_LINE_LABEL.get(data.get("engine"), "decoding_length + 1")
        ax.axvline(data["decoding_length"] + 1, **TREE_LINE, label=f"{which} ({data['decoding_length'] + 1})")
    cache = (data.get("kernels") or {}).get("cache_tokens")
    ax.set_title("forward cost " + (f"over a cache of {cache} tokens" if cache else f"(cache size {UNKNOWN})"),
                 fontsize=TITLE_FONT)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(q) for q in counts])
    ax.set_xlabel("tokens in one verification forward (count, log scale)")
    ax.set_ylabel("wall time per forward (ms)")
    ax.margins(y=Y_MARGIN)
    ax.legend(fontsize=LABEL_FONT)


def plot(data: dict[str, Any], path: str) -> None:
    """Speedup per mode (value on every bar, exact match under its name) and the forward-cost curve."""
    ref = REFERENCE if data.get("baseline") == REFERENCE else "greedy"
    fig, (a, b) = figure(2)
    speedup_panel(a, data, ref)
    _forward_cost(b, data)
    lossy = [m for m in data["modes"] if m in LOSSY]
    kinds = "lookahead modes (lossy: " + ", ".join(lossy) + ")" if lossy else "lossless lookahead modes"
    what = f"Decoding speedup, {kinds} vs {ref}; data: {known(data.get('dataset'))}"
    save(fig, path, title(data, what, baseline_label(data)))
