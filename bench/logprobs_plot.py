"""``lookahead-rag-bench logprobs``'s PNG: tok/s with logprobs OFF vs ON at each concurrency (the ON/OFF
ratio under each level), and per ON pass the largest |engine - baseline| logprob of the chosen token and
of the top-N values (log axis). Values on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import LABEL_FONT, TITLE_FONT, figure, grouped_bars, known, save, title

LOG_FLOOR = 1e-9  # a difference of exactly 0 is drawn at this height on the log axis (labelled "0")
TIE_COLOR = "tab:gray"
DIFF_SERIES = (("max_abs_logprob_diff", "chosen token's logprob"), ("max_abs_top_diff", "top-N values, same ids"))


def _diff_label(value: float) -> str:
    return "0" if value <= LOG_FLOOR else f"{value:.1e}"


def _speed(ax: Any, passes: list[dict[str, Any]]) -> None:
    levels = sorted({p["concurrency"] for p in passes})
    by = {(p["concurrency"], bool(p.get("logprobs"))): p for p in passes}
    series = {label: [by.get((c, on), {}).get("tokens_per_s") for c in levels]
              for label, on in (("logprobs OFF", False), ("logprobs ON", True))}
    ratios = [by.get((c, True), {}).get("on_off_ratio") for c in levels]
    groups = [f"{c} client(s)\nON/OFF {known(None if r is None else f'{r:.2f}x')}"
              for c, r in zip(levels, ratios, strict=True)]
    grouped_bars(ax, groups, series)
    ax.set_ylabel("generated tokens / s (every answer's tokens / pass wall time)")
    ax.set_xlabel("requests in flight (closed loop)")
    ax.set_title("what logprobs cost", fontsize=TITLE_FONT)


def _diffs(ax: Any, passes: list[dict[str, Any]], tie_gap: float | None) -> None:
    on = [p for p in passes if p.get("logprobs")]
    groups = [f"{p['name']}\ntop-N same {known(p.get('top_same_frac'))}, ties {known(p.get('top_ties'))}"
              for p in on]
    series = {label: [None if p.get(key) is None else max(p[key], LOG_FLOOR) for p in on]
              for key, label in DIFF_SERIES}
    grouped_bars(ax, groups, series, _diff_label)
    if tie_gap:
        ax.axhline(tie_gap, color=TIE_COLOR, linestyle="--", label=f"tie gap: {tie_gap:g}")
        ax.legend(fontsize=LABEL_FONT)
    ax.set(yscale="log", ylabel="largest |engine - baseline| logprob (nats, log scale)",
           xlabel="ON pass: clients in flight")
    ax.set_title("engine logprobs vs the baseline's, where the answers agree", fontsize=TITLE_FONT)


def plot(data: dict[str, Any], path: str) -> None:
    """Two panels: tok/s OFF vs ON per concurrency; the largest logprob differences per ON pass."""
    passes = data.get("passes") or []
    fig, (speed, diffs) = figure(2)
    _speed(speed, passes)
    _diffs(diffs, passes, data.get("tie_gap"))
    for ax in (speed, diffs):
        ax.tick_params(axis="x", labelsize=LABEL_FONT)
    what = (f"Logprobs: cost and equality through the engine, {known(data.get('prompts'))} prompts, "
            f"{known(data.get('max_new_tokens'))} new tokens, mode {known(data.get('mode'))}, "
            f"top {known(data.get('top_logprobs'))}, all answers equal: {known(data.get('all_equal'))}"
            f"\ndata: {known(data.get('dataset'))}; prefix cache {known(data.get('prefix_cache'))}")
    baseline = "transformers generate(do_sample=False, output_logits=True), batch 1, log_softmax fp32" \
        if data.get("baseline") == "hf_greedy_logits" else known(data.get("baseline"))
    save(fig, path, title(data, what, baseline))
