"""Redraw a benchmark's PNG from its JSON, without running anything.

    lookahead-rag-bench plot RESULT.json [--png OUT.png]
        [--kind decoding|pipeline|serve|serve_replicas|replica_sim|retrieval|events|draft_agreement|profile|
               prompt_order|exactness|logprobs|answer_quality|hog|hostile]

The kind is the file's ``"kind"`` field, else recognised by its keys (files written before the field
existed): ``levels`` -> serve, ``modes`` + ``pipeline`` -> pipeline (``decoding --via-grpc``),
``modes`` -> decoding, ``phases`` -> events, ``index`` + ``retrieval`` -> retrieval, ``exits`` ->
draft_agreement (``prompt_order``, ``exactness`` and ``logprobs`` files always carry their kind). The
PNG goes next to the JSON unless ``--png`` says where. Fields a file lacks show as "unknown" in the title.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from lookahead_rag.bench.common import write_json

# kind -> module with plot(data, path)
PLOTTERS = {
    "decoding": "lookahead_rag.bench.decoding_plot",
    "pipeline": "lookahead_rag.bench.pipeline_plot",
    "serve": "lookahead_rag.bench.serve_plot",
    "serve_replicas": "lookahead_rag.bench.serve_replicas_plot",
    "replica_sim": "lookahead_rag.bench.replica_sim_plot",
    "retrieval": "lookahead_rag.bench.retrieval_plot",
    "events": "lookahead_rag.bench.events_plot",
    "draft_agreement": "lookahead_rag.bench.draft_agreement_plot",
    "profile": "lookahead_rag.bench.profile_plot",
    "prompt_order": "lookahead_rag.bench.prompt_order_plot",
    "exactness": "lookahead_rag.bench.exactness_plot",
    "logprobs": "lookahead_rag.bench.logprobs_plot",
    "rows_kernels": "lookahead_rag.bench.rows_kernels_plot",
    "attention_kernels": "lookahead_rag.bench.attention_kernels_plot",
    "device": "lookahead_rag.bench.device_plot",
    "answer_quality": "lookahead_rag.bench.answer_quality_plot",
    "hog": "lookahead_rag.bench.hog_plot",
    "hostile": "lookahead_rag.bench.hostile_plot",
}
# (keys a file of that kind has, kind), most specific first
SIGNATURES = (
    (("levels",), "serve"),
    (("modes", "pipeline"), "pipeline"),
    (("modes",), "decoding"),
    (("phases",), "events"),
    (("index", "retrieval"), "retrieval"),
    (("exits",), "draft_agreement"),
)


def kind_of(data: dict[str, Any]) -> str:
    """The benchmark a result came from: its ``"kind"`` field, else recognised by its keys."""
    if data.get("kind") in PLOTTERS:
        return str(data["kind"])
    for keys, kind in SIGNATURES:
        if all(k in data for k in keys):
            return kind
    raise ValueError(f"not a benchmark result this command knows (keys: {', '.join(sorted(data)[:8])})")


def plot_result(data: dict[str, Any], png: str | Path, kind: str | None = None) -> str:
    """Draw ``data`` as its kind's PNG at ``png``; returns the kind drawn."""
    kind = kind or kind_of(data)
    importlib.import_module(PLOTTERS[kind]).plot(data, str(png))
    return kind


def default_png(json_path: str | Path) -> Path:
    """The PNG next to a JSON: same name, .png."""
    return Path(json_path).with_suffix(".png")


def write_outputs(data: dict[str, Any], json_path: str | None, png_path: str | None) -> None:
    """Write a benchmark's result: the JSON when asked, and its PNG (default: next to the JSON)."""
    if json_path:
        write_json(json_path, data)
        print(f"wrote {json_path}")
    png = png_path or (default_png(json_path) if json_path else None)
    if png:
        plot_result(data, png)
        print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lookahead-rag-bench plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="result file(s) written by a benchmark's --json")
    p.add_argument("--png", default=None, help="where to write (one JSON only; default: next to the JSON)")
    p.add_argument("--kind", choices=sorted(PLOTTERS), default=None, help="draw as this kind (default: detect)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.png and len(args.json) > 1:
        p.error("--png names one output: give one JSON")
    for path in args.json:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        png = args.png or default_png(path)
        try:
            kind = plot_result(data, png, args.kind)
        except ValueError as exc:
            p.error(f"{path}: {exc}")
        print(f"{path} ({kind}) -> {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
