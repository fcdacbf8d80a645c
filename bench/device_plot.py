"""The device benchmark's PNG (``bench/device.py``): step cost by width, single-stream and batched tok/s."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, label_points, save, title

SINGLE = ("hf_generate", "hf_prompt_lookup", "ours_none", "ours_hierarchical", "ours_repeat")  # single-stream ways
BATCHED = ("hf_static", "ours_none", "ours_hierarchical")  # batched ways


def _rows(data: dict[str, Any], name: str) -> dict[str, Any]:
    return (data["sections"].get(name) or {}).get("rows") or {}


def plot(data: dict[str, Any], path: str) -> None:
    """Three panels: ms a forward by width (engine and HF, each dtype), then tok/s of every way by dtype."""
    fig, (cost, one, many) = figure(3)
    for dtype in data["dtypes"]:
        sec = data["sections"].get(f"cost_{dtype}") or {}
        for key, style in (("engine_ms", "-o"), ("hf_ms", "--s")):
            pts = sorted((int(n), v) for n, v in (sec.get(key) or {}).items())
            if pts:
                xs, ys = zip(*pts, strict=True)
                line = cost.plot(xs, ys, style, label=f"{key.split('_')[0]} {dtype}")[0]
                label_points(cost, xs, ys, line.get_color())
    cost.set_xscale("log", base=2)
    cost.set_xlabel("tokens in the forward (count)")
    cost.set_ylabel("ms per forward (512 cached entries)")
    cost.grid(alpha=0.3)
    cost.legend(fontsize=7)
    groups = list(data["dtypes"])
    exact = [d for d in groups if f"single_{d}_exact" in data["sections"]]
    series = {way: [_rows(data, f"single_{d}").get(way, {}).get("tok_s") for d in groups] for way in SINGLE}
    if exact:
        series["ours_hierarchical exact"] = [_rows(data, f"single_{d}_exact").get("ours_hierarchical", {}).get("tok_s")
                                             for d in groups]
    grouped_bars(one, groups, series)
    one.set_ylabel("tokens / s, one stream")
    grouped_bars(many, groups, {way: [_rows(data, f"batched_{d}").get(way, {}).get("tok_s") for d in groups]
                                for way in BATCHED})
    many.set_ylabel("tokens / s, all requests")
    batched = next((data["sections"][f"batched_{d}"] for d in groups if "running" in
                    (data["sections"].get(f"batched_{d}") or {})), {})
    what = (f"The engine on {data['device']}: forward cost by width; one stream; "
            f"{batched.get('prompts', '?')} prompts {batched.get('running', '?')} at a time "
            f"({data['max_new']} new tokens)")
    save(fig, path, title(data, what, "transformers generate (batch 1, prompt lookup 10) and static batches "
                                      "(left-padded generate) in the same process"))
