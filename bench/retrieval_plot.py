"""``lookahead-rag-bench retrieval``'s PNG: p50 and p99 latency of each measured part, values on the bars."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import LABEL_FONT, TITLE_FONT, figure, grouped_bars, known, save, title

# JSON key -> bar group label
MEASURES = {
    "retrieval": "search\n(embed + flat FAISS)\nwall",
    "search_cpu": "search\nprocess CPU time",
    "embedding": "question embedding\nalone, wall",
    "retrieve_with_prompt": "whole Retrieve\n(incl. prompt), wall",
}
PERCENTILES = {"p50_ms": "p50", "p99_ms": "p99"}


def _header(data: dict[str, Any]) -> dict[str, Any]:
    """The title's fields: the embedder is the model; cores, threads and load from the "machine" record."""
    record = data.get("machine") or {}
    host = data.get("host") or (f"{record['cpus']} cores" if "cpus" in record else None)
    load = f", load {record['load_avg_1m']} (1 min)" if "load_avg_1m" in record else ""
    return {"model": data.get("embedder"), "cpu": data.get("cpu"), "machine": f"{known(host)}{load}",
            "threads": record.get("torch_threads")}


def plot(data: dict[str, Any], path: str) -> None:
    """p50 / p99 of search, its CPU time, the embedding alone and the whole Retrieve."""
    present = [k for k in MEASURES if k in data]
    fig, (ax,) = figure(1)
    series = {label: [data[k].get(key) for k in present] for key, label in PERCENTILES.items()}
    grouped_bars(ax, [MEASURES[k] for k in present], series, lambda v: f"{v:.1f}")
    index = data.get("index") or {}
    ax.set_ylabel("latency per question (ms)")
    ax.set_xlabel("what is timed (one call per question)")
    ax.tick_params(axis="x", labelsize=LABEL_FONT)
    ax.set_title(f"{known(index.get('kind'))} index, {known((data.get('retrieval') or {}).get('chunks'))} chunks "
                 f"({known(index.get('real_chunks'))} real), k={known(index.get('k'))}", fontsize=TITLE_FONT)
    what = f"Retrieval latency; data: {known(data.get('dataset'))}"
    save(fig, path, title(_header(data), what, "none (absolute latency)"))
