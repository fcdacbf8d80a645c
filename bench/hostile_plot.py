"""bench hostile's PNG: the victim alone (the baseline) and under the mix: TTFT p50/p99, goodput, the share of
answers that kept their documents, and the attackers' calls by outcome; the value on every bar."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import figure, grouped_bars, known, save, title

PERCENT = 100.0


def kept_percent(run: dict[str, Any]) -> float | None:
    """Answers grounded on documents, % of the completed ones (None without any)."""
    done = run.get("completed") or 0
    return PERCENT * run.get("documents", {}).get("kept", 0) / done if done else None


def plot(data: dict[str, Any], path: str) -> None:
    """Four panels: TTFT, goodput, documents kept, the hostile run's attackers."""
    runs = data["runs"]
    fig, (ttft, goodput, kept, attackers) = figure(4)
    grouped_bars(ttft, ["p50", "p99"], {w: [r.get("ttft_p50_s"), r.get("ttft_p99_s")] for w, r in runs.items()})
    ttft.set_ylabel("victim time to first token (s)")
    grouped_bars(goodput, ["victim"], {w: [r.get("goodput_tokens_per_s")] for w, r in runs.items()})
    goodput.set_ylabel("victim goodput (tokens of completed requests / s)")
    grouped_bars(kept, ["victim"], {w: [kept_percent(r)] for w, r in runs.items()})
    kept.set_ylabel("victim answers grounded on documents (% of completed)")
    hostile = runs.get("hostile", {})
    calls = {f"title {k}": v for k, v in hostile.get("refused", {}).get("outcomes", {}).items()}
    calls |= {f"upload {k}": v for k, v in hostile.get("accepted", {}).get("outcomes", {}).items()}
    calls["streams opened"] = hostile.get("holder", {}).get("opened", 0)
    grouped_bars(attackers, list(calls), {"hostile": list(calls.values())})
    attackers.tick_params(axis="x", labelrotation=30, labelsize=7)
    attackers.set_ylabel("attackers' calls in the hostile run, by outcome")
    for ax in (ttft, goodput, kept, attackers):
        ax.grid(alpha=0.3, axis="y")
    t = data.get("targets", {})
    what = (f"another tenant beside an uploader ({known(data.get('doc_mib'))} MiB documents, "
            f"{known(data.get('title_mib'))} MiB titles) and a holder ({known(data.get('hold_connections'))} x "
            f"{known(data.get('hold_streams'))} headers-only streams), {known(data.get('requests'))} victim requests "
            f"x {known(data.get('concurrency'))} clients via {known(runs.get('alone', {}).get('via'))}\n"
            f"{known(t.get('verdict'))}: TTFT p50 rise {known(t.get('ttft_p50_rise_s'))} s, p99 rise "
            f"{known(t.get('ttft_p99_rise_s'))} s (target <= {known(t.get('target_s'))} s), documents kept "
            f"{known(t.get('documents_kept'))}")
    save(fig, path, title(data, what, "the victim alone on a fresh stack with the same keys and proxy (alone)"))
