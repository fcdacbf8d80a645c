"""The benchmarks' PNGs from hand-made results (no model, no benchmark run) and the bundled question set."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from lookahead_rag.bench import dataset
from lookahead_rag.bench.plot import PLOTTERS, kind_of, main, plot_result
from lookahead_rag.bench.plot_common import UNKNOWN, machine_label, title
from tests.bench import replica_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GREEDY_ROW = {"new_tokens": 100, "wall_s": 10.0, "tokens_per_s": 10.0, "forward_steps": 98,
              "mean_accepted_per_step": 1.02, "speedup_vs_greedy": 1.0, "speedup_vs_none": 0.9,
              "exact_match_vs_greedy": 1.0}
FAST_ROW = {**GREEDY_ROW, "wall_s": 5.0, "forward_steps": 50, "mean_accepted_per_step": 2.0,
            "speedup_vs_greedy": 2.0, "speedup_vs_none": 1.8, "squad_f1": 61.5}  # F1 under the bar


def _decoding(**extra: Any) -> dict[str, Any]:
    """A decoding result as written today (kernels, engine, machine and dataset recorded)."""
    return {
        "kind": "decoding", "model": "tiny", "device": "cpu (x86_64)", "cpu": "Test CPU", "machine": "Linux, 2 cores",
        "dataset": "bundled", "threads": 2, "scenario": "cold", "questions": 2, "max_new_tokens": 16,
        "decoding_length": 8, "engine": "scheduler", "greedy_baseline": "hf",
        "forward_cost_ms": {"1": 40.0, "8": 60.0},
        "kernels": {"cache_tokens": 300, "measured_s": {"token_counts": [1, 8],
                                                        "seconds": {"stock": [0.05, 0.08], "packed": [0.04, 0.06]}}},
        "modes": {"greedy": GREEDY_ROW, "hierarchical": FAST_ROW}, **extra,
    }


def _old_decoding() -> dict[str, Any]:
    """A file from before kernels, engine, machine and the greedy baseline were recorded."""
    data = _decoding()
    for key in ("kind", "cpu", "machine", "dataset", "engine", "greedy_baseline", "kernels"):
        data.pop(key)
    return data


def _sampled() -> dict[str, Any]:
    rows = {m: {k.replace("greedy", "reference"): v for k, v in r.items()}
            for m, r in {"reference": GREEDY_ROW, "hierarchical": FAST_ROW}.items()}
    data = {**_decoding(), "baseline": "reference", "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 0,
            "modes": rows}
    data.pop("greedy_baseline")
    return data


def _pipeline() -> dict[str, Any]:
    return {**_decoding(kind="pipeline"), "questions": 8,
            "pipeline": {"in_process_wall_s": 16.0, "grpc_wall_s": 16.8, "overhead_frac": 0.05, "same_outputs": 1.0},
            "retrieval": {"chunks": 150, "p50_ms": 17.7, "p99_ms": 26.5}}


def _serve_way(goodput: float, ttft: float) -> dict[str, Any]:
    return {"completed": 4, "errors": {}, "goodput_tokens_per_s": goodput, "ttft_p99_s": ttft}


def _serve() -> dict[str, Any]:
    levels = {str(c): {"on": _serve_way(17.0 * c, 3.0 * c), "off": _serve_way(9.0 * c, 3.0 * c),
                       "serial_hf": _serve_way(8.0, 2.0 * c * c)} for c in (1, 4)}
    return {"model": "tiny", "device": "cuda (Test GPU)", "threads": 2, "requests": 4, "zipf": 1.1, "levels": levels,
            "pool": 4, "max_new_tokens": 16, "serial_baseline": "hf_greedy"}


def _retrieval() -> dict[str, Any]:
    pct = {"p50_ms": 12.0, "p99_ms": 20.0}
    return {"retrieval": {"chunks": 10000, **pct}, "search_cpu": pct, "embedding": pct, "retrieve_with_prompt": pct,
            "index": {"kind": "flat", "real_chunks": 1600, "variant_chunks": 8400, "build_s": 3.0, "k": 4},
            "machine": {"cpus": 2, "torch_threads": 1, "load_avg_1m": 1.0, "python": "3.11"}}


def _events() -> dict[str, Any]:
    phase = {"events": 10, "lost": 0, "applied_twice": 0, "kills": 0, "lag_p50_s": 0.01, "lag_p99_s": 0.05,
             "lag_max_s": 0.06, "wall_s": 1.0}
    return {"events": 10, "rate": 200.0, "kill_every": 5, "kill_mode": "task", "partitions": 2, "broker": "test",
            "phases": [{**phase, "phase": "steady"}, {**phase, "phase": "kills (task)", "kills": 2}]}


def _draft_agreement() -> dict[str, Any]:
    return {"kind": "draft_agreement", "model": "tiny", "dataset": "test", "threads": 2, "questions": 2,
            "tokens": 100, "target_layers": 30, "target_ms": 50.0,
            "exits": [{"layers": 7, "agreement": 0.05, "draft_ms": 14.0, "cost_vs_target": 0.28},
                      {"layers": 28, "agreement": 0.45, "draft_ms": 47.0, "cost_vs_target": 0.94}]}


def _profile() -> dict[str, Any]:
    """A step profile as bench decoding / serve --profile write it (the decoding file's kind says 'profile'
    only when the profile PNG is drawn: ``plot_result(data, png, kind="profile")``)."""
    def report(layers: float, tokens: float) -> dict[str, Any]:
        ms = {"draft": 1.0, "pack": 0.5, "layers": layers, "attention": 6.0, "lm_head": 5.0, "choose": 0.4,
              "accept": 0.8, "emit": 0.3, "other": 1.2, "between": 12.0}
        return {"steps": 10, "ms_per_step": ms, "tokens_per_forward": tokens, "emitted_per_step": 2.5, "wall_s": 1.0}
    return {"kind": "profile", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "profile": {"none decode": report(40.0, 1.0), "hierarchical decode": report(55.0, 9.0),
                        "hierarchical prefill": report(300.0, 250.0)}}


def _prompt_order() -> dict[str, Any]:
    def order(hits: float, em: float) -> dict[str, Any]:
        return {"prompts": 4, "prompt_tokens": 2000, "prefix_hit_tokens": int(2000 * hits), "mean_prompt_tokens": 500.0,
                "mean_hit_tokens": 500.0 * hits, "hit_fraction": hits, "scored": 4, "exact_match": em, "f1": em + 20.0}
    return {"kind": "prompt_order", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "dataset": "test", "questions": 4, "tenants": 1, "max_new_tokens": 8,
            "orders": {"canonical": order(0.6, 25.0), "score": order(0.2, 25.0)}}


def _exactness() -> dict[str, Any]:
    def one(name: str, hits: float, mismatches: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "answers": 4, "exact": 4 - len(mismatches), "mismatch_count": len(mismatches),
                "mismatches": mismatches, "mean_hit_tokens": hits}
    flip = {"index": 1, "position": 3, "margin": 2e-5, "tie": True, "ours": 5, "reference": 6, "gap": 2e-5}
    return {"kind": "exactness", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "dataset": "test", "prompts": 4, "max_new_tokens": 8, "mode": "hierarchical", "baseline": "hf_greedy",
            "mean_prompt_tokens": 400.0, "mismatches_total": 1,
            "passes": [one("c1 off", 0.0, []), one("c16 warm", 399.0, [flip])],
            "per_answer": [{"min_margin": m} for m in (2e-5, 0.3, 1.5, None)]}


def _logprobs() -> dict[str, Any]:
    # one level measured, one whose ON pass compared nothing (None) and found an exact 0 elsewhere
    on = {"logprobs": True, "max_abs_logprob_diff": 6.6e-6, "max_abs_top_diff": 0.0, "top_same_frac": 1.0,
          "top_ties": 0, "on_off_ratio": 0.98, "tokens_per_s": 9.8}
    passes = [{"name": "c1 off", "concurrency": 1, "logprobs": False, "tokens_per_s": 10.0},
              {"name": "c1 on", "concurrency": 1, **on},
              {"name": "c16 off", "concurrency": 16, "logprobs": False, "tokens_per_s": 40.0},
              {"name": "c16 on", "concurrency": 16, **on, "max_abs_logprob_diff": None, "on_off_ratio": None}]
    return {"kind": "logprobs", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "prompts": 4, "max_new_tokens": 8, "top_logprobs": 5, "baseline": "hf_greedy_logits",
            "tie_gap": 1e-4, "passes": passes}


def _answer_quality() -> dict[str, Any]:
    def served(order: str, held: float | None, search: str = "dense") -> dict[str, Any]:
        return {"search": search, "order": order, "k": 3, "gold_in_prompt_pct": held, "squad_em": 10.0,
                "squad_f1": 30.0, "wrongly_abstained_pct": 5.0, "abstained_pct": 60.0, "answered_anyway_pct": 40.0}

    def past(f1: float, per_step: float) -> dict[str, Any]:
        return {"squad_em": 5.0, "squad_f1": f1, "tokens_per_step": per_step, "tokens_per_s": 8.0}
    return {"kind": "answer_quality", "model": "tiny", "cpu": "Test CPU", "machine": "Linux, 2 cores", "threads": 2,
            "dataset": "test", "questions": 4, "unanswerable_questions": 2, "tenants": 1, "max_new_tokens": 8,
            "retrieval": {"recall@1": 75.0, "recall@3": 100.0, "recall@5": 100.0, "recall@10": 100.0},
            "gold": {"squad_em": 25.0, "squad_f1": 40.0, "wrongly_abstained_pct": 0.0},
            "served": [served("canonical", 100.0), served("score", None), served("canonical", 75.0, "hybrid")],
            "past": {"prompt_all": past(10.0, 2.5), "prompt": past(30.0, 2.4), "drafts": past(30.0, 2.4),
                     "none": past(30.0, 1.5), "drafts_equal_none": True}}


RESULTS = {
    "answer quality": _answer_quality,
    "logprobs": _logprobs,
    "exactness": _exactness,
    "prompt order": _prompt_order,
    "profile": _profile,
    "draft agreement": _draft_agreement,
    "decoding": _decoding, "old decoding": _old_decoding, "sampled decoding": _sampled, "pipeline": _pipeline,
    "serve": _serve, "retrieval": _retrieval, "events": _events,
    "serve replicas": replica_results.serve_replicas, "replica sim": replica_results.replica_sim,
    "rows kernels": lambda: {"kind": "rows_kernels", "model": "tiny", "threads": 2, "cpu": "Test CPU",
                             "machine": "Linux, 2 cores", "sizes": [1, 8],
                             "ms": {"stock": {"1": 3.0, "8": 9.0}, "avx2": {"1": 1.0, "8": 4.0}}},
    "attention kernels": lambda: {"kind": "attention_kernels", "model": "tiny", "threads": 2, "cpu": "Test CPU",
                                  "machine": "Linux, 2 cores", "cases": ["tree 4", "chunk 64"],
                                  "ms": {"sdpa": {"tree 4": 3.0, "chunk 64": 9.0},
                                         "avx2": {"tree 4": 1.0, "chunk 64": 4.0}}},
    "device": lambda: {"kind": "device", "model": "tiny", "device": "cuda (Test GPU)", "threads": 2, "max_new": 8,
                       "dtypes": ["float32", "bfloat16"], "sections": {
                           "cost_float32": {"engine_ms": {"1": 2.0, "8": 2.1}, "hf_ms": {"1": 16.0, "8": 16.5}},
                           "single_float32": {"rows": {"hf_generate": {"tok_s": 50.0},
                                                       "ours_hierarchical": {"tok_s": 300.0}}},
                           "single_bfloat16_exact": {"rows": {"ours_hierarchical": {"tok_s": 250.0}}},
                           "batched_bfloat16": {"running": 16, "prompts": 48,
                                                "rows": {"hf_static": {"tok_s": 500.0}}},
                           "batched_float32": {"skipped": "out of time"}}},
    "hog": lambda: {"kind": "hog", "model": "tiny", "threads": 2, "cpu": "Test CPU", "machine": "Linux, 2 cores",
                    "requests": 8, "concurrency": 2, "hog_streams": 32,
                    "runs": {"plain": {"goodput_tokens_per_s": 40.0, "ttft_p50_s": 0.3, "prefix_hit_tokens": 900,
                                       "mean_accepted_per_step": 2.1},
                             "hog": {"goodput_tokens_per_s": 30.0, "ttft_p50_s": None, "prefix_hit_tokens": 880,
                                     "mean_accepted_per_step": 2.0, "hog_prompt_tokens": 5000}},
                    "targets": {"prefix_hits_kept": 0.98, "ttft_p50_rise_chunks": None}},
    "hostile": lambda: {"kind": "hostile", "model": "tiny", "threads": 2, "cpu": "Test CPU",
                        "machine": "Linux, 2 cores", "requests": 8, "concurrency": 2, "doc_mib": 4.0,
                        "title_mib": 2.0, "hold_connections": 4, "hold_streams": 100,
                        "runs": {"alone": {"completed": 8, "ttft_p50_s": 0.5, "ttft_p99_s": 1.0,
                                           "goodput_tokens_per_s": 40.0, "documents": {"kept": 8}, "via": "direct"},
                                 "hostile": {"completed": 8, "ttft_p50_s": 0.9, "ttft_p99_s": None,
                                             "goodput_tokens_per_s": 20.0, "documents": {"kept": 7},
                                             "refused": {"outcomes": {"grpc:INVALID_ARGUMENT": 3}},
                                             "accepted": {"outcomes": {"grpc:OK": 1}}, "holder": {"opened": 400}}},
                        "targets": {"ttft_p50_rise_s": 0.4, "target_s": 1.5, "verdict": "PASS"}},
}
KINDS = {"answer quality": "answer_quality",
         "logprobs": "logprobs", "exactness": "exactness", "prompt order": "prompt_order", "profile": "profile",
         "draft agreement": "draft_agreement",
         "decoding": "decoding", "old decoding": "decoding", "sampled decoding": "decoding", "pipeline": "pipeline",
         "serve": "serve", "retrieval": "retrieval", "events": "events",
         "serve replicas": "serve_replicas", "replica sim": "replica_sim", "rows kernels": "rows_kernels",
         "attention kernels": "attention_kernels", "device": "device", "hog": "hog", "hostile": "hostile"}


@pytest.mark.parametrize("name", list(RESULTS))
def test_every_kind_is_recognised_and_drawn_to_a_png(name: str, tmp_path: Path) -> None:
    data = RESULTS[name]()
    assert kind_of(data) == KINDS[name]
    png = tmp_path / "out.png"
    assert plot_result(data, png) == KINDS[name]
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_every_plotter_is_covered() -> None:
    assert set(KINDS.values()) == set(PLOTTERS)


def test_kind_detection_without_the_kind_field() -> None:
    pipeline = _pipeline()
    pipeline.pop("kind")
    assert kind_of(pipeline) == "pipeline"  # "modes" + "pipeline": a decoding --via-grpc file
    with pytest.raises(ValueError):
        kind_of({"something": 1})


def test_the_plot_command_writes_next_to_the_json(tmp_path: Path) -> None:
    path = tmp_path / "cold.json"
    path.write_text(json.dumps(_old_decoding()))
    assert main([str(path)]) == 0
    assert (tmp_path / "cold.png").read_bytes().startswith(PNG_MAGIC)
    assert main([str(path), "--png", str(tmp_path / "other.png"), "--kind", "decoding"]) == 0
    assert (tmp_path / "other.png").exists()


def test_titles_name_model_machine_threads_and_baseline_and_say_unknown_when_not_recorded() -> None:
    text = title({"model": "m", "device": "cpu (x86_64)", "threads": 2}, "what", "greedy")
    assert "model m" in text and "threads 2" in text and "baseline: greedy" in text
    assert f"CPU {UNKNOWN}" in text  # no "cpu" field: not guessed from this machine
    assert machine_label({"device": "cuda (Test GPU)"}) == "GPU Test GPU"
    assert machine_label({"cpu": "Test CPU", "machine": "Linux, 2 cores"}) == "CPU Test CPU, Linux, 2 cores"
    assert f"threads {UNKNOWN}" in title({}, "what", "none")
    # the served weights' format and, where recorded, the request caches' dtype
    assert "model m (Q4_1 weights, float16 KV)" in title({"model": "m", "weights": "Q4_1", "kv_dtype": "float16"},
                                                       "what", "none")
    assert "model m (float32 weights)" in title({"model": "m", "weights": "float32"}, "what", "none")


# --- the bundled question set ---


def _rows(source: dataset.Source) -> list[dict[str, Any]]:
    with source.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_the_bundled_set_loads_and_every_question_has_its_document() -> None:
    ds = dataset.bundled()
    corpus = {row["id"]: row for row in _rows(ds.corpus)}
    questions = _rows(ds.questions)
    assert corpus and questions
    assert all(row["text"] and row["title"] for row in corpus.values())
    assert all(q["question"] and q["doc_id"] in corpus and q.get("answerable", True) for q in questions)
    assert len({q["id"] for q in questions}) == len(questions)
    assert (dataset.bundled_file(dataset.CORPUS_FILE).parent / "LICENSE").is_file()  # CC BY-SA attribution


def test_the_bundled_set_covers_the_default_limit_and_calibration() -> None:
    from lookahead_rag.bench.decoding_args import DEFAULT_CALIBRATE, DEFAULT_LIMIT

    assert len(_rows(dataset.bundled().questions)) >= DEFAULT_LIMIT + DEFAULT_CALIBRATE


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    dataset.add_dataset_args(p)
    args = p.parse_args(argv)
    args.dataset = dataset.dataset_from_args(p, args)
    return args


def test_no_flags_mean_the_bundled_set_and_your_files_go_in_pairs(tmp_path: Path) -> None:
    args = _parse([])
    assert args.dataset.name == dataset.BUNDLED_NAME and args.questions == dataset.bundled().questions
    own = _parse(["--corpus", str(tmp_path / "c.jsonl"), "--questions", str(tmp_path / "q.jsonl")])
    assert own.corpus == tmp_path / "c.jsonl" and str(tmp_path) in own.dataset.name
    with pytest.raises(SystemExit):
        _parse(["--corpus", "c.jsonl"])


def test_the_serve_workload_reads_the_bundled_set() -> None:
    from lookahead_rag.bench.serve_load import load_workload

    ds = dataset.bundled()
    wl = load_workload(ds.corpus, ds.questions, pool=100, by_title=True)
    assert len(wl.pool) == len(_rows(ds.questions)) and list(wl.docs) == ["Normans"]


def test_the_decoding_flags_default_to_the_bundled_set() -> None:
    from lookahead_rag.bench.decoding_args import parse_args

    args = parse_args([])
    assert args.dataset == dataset.BUNDLED_NAME and args.corpus == dataset.bundled().corpus
