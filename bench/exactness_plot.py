"""``lookahead-rag-bench exactness``'s PNG: per engine pass, the answers equal to the baseline's and the
prefix-cache hits it ran with; the baseline's smallest top-1/top-2 margin per answer (histogram), with
every mismatch's margin marked. Values on every bar."""

from __future__ import annotations

import math
from typing import Any

from lookahead_rag.bench.plot_common import LABEL_FONT, TITLE_FONT, figure, known, label_bars, save, title
from lookahead_rag.bench.ties import TIE_LOGIT_GAP

LOG_BINS = tuple(range(-8, 3))  # histogram edges, log10 of the margin (1e-8 .. 100)
MISMATCH_COLOR = "tab:red"
EXACT_COLOR = "tab:green"
HIT_COLOR = "tab:blue"
TIE_COLOR = "tab:gray"


def _exact(ax: Any, passes: list[dict[str, Any]]) -> None:
    names = [p["name"] for p in passes]
    exact = [p.get("exact") for p in passes]
    bars = ax.bar(names, [e or 0 for e in exact], color=EXACT_COLOR)
    label_bars(ax, bars, exact, lambda v: f"{v:.0f}")
    for i, p in enumerate(passes):
        count = p.get("mismatch_count", 0)
        if count:
            ax.annotate(f"{count} mismatch(es)", (i, 0), textcoords="offset points", xytext=(0, 4), ha="center",
                        fontsize=LABEL_FONT, color=MISMATCH_COLOR)
    ax.set_ylabel(f"answers equal to the baseline's (of {known(passes[0].get('answers') if passes else None)})")
    ax.set_xlabel("engine pass: clients in flight, prefix cache")
    ax.set_title("token-for-token equal answers", fontsize=TITLE_FONT)


def _hits(ax: Any, passes: list[dict[str, Any]], prompt_tokens: float | None) -> None:
    names = [p["name"] for p in passes]
    hits = [p.get("mean_hit_tokens") for p in passes]
    bars = ax.bar(names, [h or 0.0 for h in hits], color=HIT_COLOR)
    label_bars(ax, bars, hits)
    if prompt_tokens:
        ax.axhline(prompt_tokens, color=TIE_COLOR, linestyle="--", label=f"mean prompt: {prompt_tokens:.0f} tokens")
        ax.legend(fontsize=LABEL_FONT)
    ax.set_ylabel("prompt tokens from the prefix cache (mean per prompt)")
    ax.set_xlabel("engine pass: clients in flight, prefix cache")
    ax.set_title("prefix hits the pass ran with", fontsize=TITLE_FONT)


def _margins(ax: Any, data: dict[str, Any]) -> None:
    margins = [a["min_margin"] for a in data.get("per_answer") or [] if a.get("min_margin") is not None]
    counts = [0] * (len(LOG_BINS) - 1)
    for m in margins:
        at = math.log10(m) if m > 0 else LOG_BINS[0]
        i = min(max(math.floor(at) - LOG_BINS[0], 0), len(counts) - 1)
        counts[i] += 1
    bars = ax.bar([lo + 0.5 for lo in LOG_BINS[:-1]], counts, width=0.9, color=HIT_COLOR)
    label_bars(ax, bars, counts, lambda v: f"{v:.0f}")
    ax.axvline(math.log10(TIE_LOGIT_GAP), color=TIE_COLOR, linestyle="--", label=f"tie: {TIE_LOGIT_GAP:g}")
    marked = False
    for p in data.get("passes") or []:
        for mm in p.get("mismatches") or []:
            if mm.get("margin"):
                ax.axvline(math.log10(mm["margin"]), color=MISMATCH_COLOR,
                           label=None if marked else "a mismatch's margin")
                marked = True
    ax.set_xticks(LOG_BINS, [f"1e{e}" for e in LOG_BINS])
    ax.set_xlabel("smallest top-1 minus top-2 logit along the baseline's answer (log scale)")
    ax.set_ylabel("answers")
    ax.set_title("how near a tie each greedy answer came", fontsize=TITLE_FONT)
    ax.legend(fontsize=LABEL_FONT)


def plot(data: dict[str, Any], path: str) -> None:
    """Three panels: equal answers per pass, prefix hits per pass, the margin histogram."""
    passes = data.get("passes") or []
    fig, (exact, hits, margins) = figure(3)
    _exact(exact, passes)
    _hits(hits, passes, data.get("mean_prompt_tokens"))
    _margins(margins, data)
    for ax in (exact, hits):
        ax.tick_params(axis="x", labelsize=LABEL_FONT)
    what = (f"Exactness: engine answers vs the baseline's, {known(data.get('prompts'))} prompts, "
            f"{known(data.get('max_new_tokens'))} new tokens, mode {known(data.get('mode'))}, "
            f"{known(data.get('mismatches_total'))} mismatch(es)\ndata: {known(data.get('dataset'))}")
    baseline = "transformers generate(do_sample=False), batch 1" if data.get("baseline") == "hf_greedy" \
        else known(data.get("baseline"))
    save(fig, path, title(data, what, baseline))
