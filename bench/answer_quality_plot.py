"""``lookahead-rag-bench quality``'s PNG: retrieval recall@k; EM / F1 with the gold paragraph and served;
abstention on unanswerable questions; past answers in the prompt / as drafts / not at all (EM, F1, speed)."""

from __future__ import annotations

import textwrap
from typing import Any

from lookahead_rag.bench.plot_common import TITLE_FONT, figure, grouped_bars, known, save, title

WRAP = 80  # characters a title line may take before it wraps (the panel's width)
QUALITY = {"squad_em": "EM", "squad_f1": "F1"}
ABSTAIN = {"abstained_pct": "unanswerable: said so", "answered_anyway_pct": "unanswerable: answered anyway",
           "wrongly_abstained_pct": "answerable: wrongly said so",
           "checked_abstained_pct": "unanswerable: withheld (abstain check)",
           "checked_wrongly_abstained_pct": "answerable: withheld (abstain check)"}
PAST_QUALITY = {"squad_em": "EM %", "squad_f1": "F1 %"}
PAST_SPEED = {"tokens_per_step": "tokens per step", "tokens_per_s": "tok/s"}


def plot(data: dict[str, Any], path: str) -> None:
    """Four panels (three without a past-answer study)."""
    past = data.get("past") or {}
    past_names = [n for n in ("prompt_all", "prompt", "drafts", "none") if n in past]
    fig, axes = figure(4 if past_names else 3)
    recall, quality, abstain = axes[:3]
    by_search = data.get("retrieval_by_search") or {"search": data.get("retrieval") or {}}
    groups = list(dict.fromkeys(key for found in by_search.values() for key in found))
    grouped_bars(recall, [g.replace("_", "\n").replace(" ", "\n") for g in groups],
                 {name: [found.get(g) for g in groups] for name, found in by_search.items()}, lambda v: f"{v:.0f}%")
    served = data.get("served") or []
    held = ", ".join(f"{_served(s, ' ')}: {known(s.get('gold_in_prompt_pct'))}%" for s in served)
    answered = "\n" + textwrap.fill(f"answered with: {held}", WRAP) if held else ""
    recall.set_title(f"own paragraph in the top k chunks (recall@k) and in the served prompt (in_prompt@k)\n"
                     f"{known(data.get('indexed_chunks'))} chunks indexed{answered}", fontsize=TITLE_FONT)
    recall.set_ylabel("% of answerable questions")
    names = ["gold", *[_served(s, "\n") for s in served]]
    rows = [data.get("gold") or {}, *served]
    if not data.get("gold"):  # --recall-only: no answers were generated
        for ax in (quality, abstain):
            ax.set_axis_off()
            ax.set_title("no answers generated (--recall-only)", fontsize=TITLE_FONT)
        save(fig, path, title(data, _what(data), "dense search (FAISS) and hybrid (FAISS + BM25, RRF)"))
        return
    grouped_bars(quality, names, {label: [row.get(k) for row in rows] for k, label in QUALITY.items()})
    quality.set_title(f"answerable questions, greedy, {known(data.get('max_new_tokens'))} new tokens at most",
                      fontsize=TITLE_FONT)
    quality.set_ylabel("SQuAD score (%), max over reference answers")
    grouped_bars(abstain, names[1:], {label: [s.get(k) for s in served] for k, label in ABSTAIN.items()})
    abstain.set_title(f"abstention: {known(data.get('unanswerable_questions'))} unanswerable questions",
                      fontsize=TITLE_FONT)
    abstain.set_ylabel("% of answers")
    if past_names:
        ax = axes[3]
        series = {label: [past[n].get(k) for n in past_names] for k, label in PAST_QUALITY.items()}
        series |= {label: [past[n].get(k) for n in past_names] for k, label in PAST_SPEED.items()}
        grouped_bars(ax, [f"past answers:\n{n}" for n in past_names], series)
        ax.set_title("past answers accumulating (engine, hierarchical)", fontsize=TITLE_FONT)
        ax.set_ylabel("% (EM, F1) / tokens per step / tok/s")
    save(fig, path, title(data, _what(data), "the same model handed the question's own paragraph (gold)"))


def _served(row: dict[str, Any], sep: str) -> str:
    """A served setting's label: its search (when recorded), passage order and k."""
    ratio = row.get("min_score_ratio")
    return sep.join(p for p in (row.get("search"), row["order"], f"k={row['k']}", f"r={ratio:g}" if ratio else "")
                    if p)


def _what(data: dict[str, Any]) -> str:
    extra = f" + distractors {data['distractors']}" if data.get("distractors") else ""
    return (f"Answer quality end to end: {known(data.get('questions'))} answerable questions, "
            f"{known(data.get('tenants'))} tenant(s)\ndata: {known(data.get('dataset'))}{extra}")
