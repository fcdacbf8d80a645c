"""bench-serve's pure parts: the seeded Zipf sequence, percentiles, aggregation and the JSON shape."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lookahead_rag.bench.serve_load import draw_sequence, load_workload, zipf_weights
from lookahead_rag.bench.serve_stats import EngineStats, RequestRecord, percentile, serial_queue, summarize

W_KEYS = {"completed", "errors", "goodput_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
          "mean_accepted_per_step", "mean_tokens_per_forward", "prefix_hit_tokens", "exact_match"}


def test_sequence_is_fixed_by_the_seed() -> None:
    a = draw_sequence(50, 200, 1.1, seed=7)
    assert a == draw_sequence(50, 200, 1.1, seed=7)
    assert a != draw_sequence(50, 200, 1.1, seed=8)
    assert len(a) == 200 and all(0 <= i < 50 for i in a)
    assert draw_sequence(50, 20, 1.1, seed=7) == a[:20]  # more requests extend the same sequence


def test_popularity_follows_zipf_over_a_shuffled_pool() -> None:
    counts = Counter(draw_sequence(20, 5000, 1.2, seed=1))
    w = zipf_weights(20, 1.2)
    top = counts.most_common(1)[0][1] / 5000
    assert top == pytest.approx(w[0] / sum(w), abs=0.03)


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def _rec(index: int, sent: float, deltas: list[tuple[float, int]], prompt: list[int], out: list[int],
         steps: int = 2, error: str | None = None) -> RequestRecord:
    stats = None if error else EngineStats(new_tokens=len(out), forward_steps=steps, tokens_per_forward=4.0,
                                           prefix_hit_tokens=10)
    return RequestRecord(index, sent, deltas, deltas[-1][0] if deltas else sent + 1, error, prompt, out, stats)


def test_summary_definitions_and_shape() -> None:
    recs = [
        _rec(0, 0.0, [(1.0, 1), (1.5, 2), (2.5, 1)], [1, 2], [5, 6, 7, 8]),  # itl: .25, .25, 1.0
        _rec(1, 0.5, [(2.5, 2)], [1, 3], [9, 9], steps=1),
        _rec(2, 1.0, [], [], [], error="RESOURCE_EXHAUSTED"),
    ]
    greedy = {(1, 2): [5, 6, 7, 8], (1, 3): [9, 0]}
    w = summarize(recs, 4.0, greedy)
    assert set(w) >= W_KEYS
    assert w["completed"] == 2 and w["errors"] == {"RESOURCE_EXHAUSTED": 1}
    assert w["goodput_tokens_per_s"] == pytest.approx(6 / 4.0)
    assert w["ttft_p50_s"] == pytest.approx(1.5)  # TTFTs 1.0 and 2.0
    assert w["itl_p50_s"] == pytest.approx(0.25)
    assert w["mean_accepted_per_step"] == pytest.approx(6 / 3)
    assert w["mean_tokens_per_forward"] == pytest.approx(4.0)
    assert w["prefix_hit_tokens"] == 20
    assert w["exact_match"] == pytest.approx(0.5)
    json.dumps(w)  # plain JSON types only


def test_serial_queue_charges_the_wait_behind_other_clients() -> None:
    # back-to-back serial runs of 1 s each; the first token 0.2 s into each
    recs = [_rec(i, float(i), [(i + 0.2, 1), (i + 1.0, 1)], [i], [1, 2]) for i in range(4)]
    one = serial_queue(recs, 1)
    assert [r.ttft_s for r in one] == pytest.approx([0.2] * 4)
    two = serial_queue(recs, 2)  # request i is sent when request i-2 ended
    assert [r.ttft_s for r in two] == pytest.approx([0.2, 1.2, 1.2, 1.2])


def test_tenants_by_title(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"id": "Normans#0", "title": "Normans", "text": "a"}, {"id": "Normans#1", "title": "Normans", "text": "b"},
        {"id": "Oxygen#0", "title": "Oxygen", "text": "c"}]))
    qs = tmp_path / "q.jsonl"
    qs.write_text("\n".join(json.dumps(r) for r in [
        {"id": "1", "question": "x?", "doc_id": "Oxygen#0"}, {"id": "2", "question": "y?", "doc_id": "Normans#1",
                                                               "answerable": False},
        {"id": "3", "question": "z?", "doc_id": "Normans#1"}]))
    wl = load_workload(str(corpus), str(qs), pool=10, by_title=True)
    assert {t: len(d) for t, d in wl.docs.items()} == {"Normans": 2, "Oxygen": 1}
    assert [(q.qid, q.tenant) for q in wl.pool] == [("1", "Oxygen"), ("3", "Normans")]
    one = load_workload(str(corpus), str(qs), pool=1, by_title=False)
    assert list(one.docs) == ["bench"] and [q.tenant for q in one.pool] == ["bench"]


# --- sampling flags (--temperature/--top-p/--top-k/--seed) of bench decoding and bench serve ---

GREEDY_ROW_KEYS = ["new_tokens", "wall_s", "tokens_per_s", "forward_steps", "mean_accepted_per_step",
                   "speedup_vs_greedy", "speedup_vs_none", "exact_match_vs_greedy", "joules_per_token",
                   "differ_frac", "mean_logprob", "squad_em", "squad_f1", "squad_scored"]


def test_mode_rows_against_greedy_keep_their_keys_and_against_the_reference_rename_them() -> None:
    from lookahead_rag.bench.decoding import ModeTotals

    ref = ModeTotals(new_tokens=40, wall_s=8.0, forward_steps=40, exact=2, questions=2)
    none = ModeTotals(new_tokens=40, wall_s=4.0, forward_steps=40, exact=2, questions=2)
    mode = ModeTotals(new_tokens=40, wall_s=2.0, forward_steps=10, exact=1, questions=2)
    assert list(mode.row(ref, none)) == GREEDY_ROW_KEYS
    row = mode.row(ref, none, "reference")
    assert list(row) == [k.replace("greedy", "reference") for k in GREEDY_ROW_KEYS]
    assert row["speedup_vs_reference"] == pytest.approx(4.0)
    assert row["speedup_vs_none"] == pytest.approx(2.0)
    assert row["exact_match_vs_reference"] == pytest.approx(0.5)
    assert row["mean_accepted_per_step"] == pytest.approx(4.0)
    assert ModeTotals().row(ref, none, "reference")["speedup_vs_reference"] is None  # no time, no ratio


def test_modes_put_the_baseline_first_greedy_or_reference() -> None:
    from lookahead_rag.bench.decoding import DEFAULT_MODES, resolve_modes

    assert resolve_modes(DEFAULT_MODES, sampling=False) == [
        "greedy", "none", "prompt-lookup", "llma", "parallel", "hierarchical"]
    assert resolve_modes(DEFAULT_MODES, sampling=True) == [
        "reference", "none", "prompt-lookup", "llma", "parallel", "hierarchical"]
    assert resolve_modes("hierarchical,none", sampling=True) == ["reference", "none", "hierarchical"]
    assert resolve_modes("reference", sampling=False) == ["greedy", "none", "reference"]  # its loop at T=0
    with pytest.raises(SystemExit):
        resolve_modes("greedy,nope", sampling=False)
    assert resolve_modes("jacobi,hierarchical+jacobi", sampling=False) == [
        "greedy", "none", "jacobi", "hierarchical+jacobi"]
    with pytest.raises(SystemExit):
        resolve_modes("llma+jacobi", sampling=False)  # only the hierarchical tree takes the pool


def test_jacobi_modes_carry_the_window_shape_and_the_others_do_not() -> None:
    from lookahead_core import DecodingConfig, DraftMode

    from lookahead_rag.bench.decoding import mode_config
    from lookahead_rag.bench.decoding_args import parse_args

    base = DecodingConfig()
    shape = parse_args(["--jacobi", "5,4,3"]).jacobi
    merged = mode_config(base, "hierarchical+jacobi", shape)
    assert (merged.mode, merged.jacobi_window, merged.jacobi_ngram, merged.jacobi_guesses) == (
        DraftMode.HIERARCHICAL, 5, 4, 3)
    assert mode_config(base, "jacobi", shape).jacobi_window == 5
    # plain hierarchical does not take --jacobi: its window stays the default (None: sized by measured cost)
    assert mode_config(base, "hierarchical", shape).jacobi_window is None
    with pytest.raises(SystemExit):
        parse_args(["--jacobi", "5,1,3"])  # N < 2: no n-gram


def test_sampling_flags_map_to_the_config_hf_and_the_json() -> None:
    from lookahead_rag.bench.sampling_args import Sampling, speedup

    greedy = Sampling()
    assert not greedy.enabled and greedy.config_kwargs() == {} and greedy.hf_kwargs() == {"do_sample": False}
    s = Sampling(temperature=0.7, top_p=0.9, top_k=0, seed=5)
    assert s.config_kwargs() == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 5}
    assert s.hf_kwargs() == {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0}
    assert s.record() == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 5}
    assert speedup(6.0, 2.0) == pytest.approx(3.0) and speedup(6.0, 0.0) is None


def test_bad_sampling_flags_are_usage_errors() -> None:
    from lookahead_rag.bench.decoding import parse_args

    base = ["--corpus", "c", "--questions", "q"]
    assert parse_args([*base, "--temperature", "0.7", "--top-p", "0.9", "--seed", "1"]).sampling.enabled
    assert not parse_args(base).sampling.enabled
    with pytest.raises(SystemExit):
        parse_args([*base, "--temperature", "0.7", "--top-p", "1.5"])


def test_requests_carry_the_sampling_params_and_greedy_ones_none() -> None:
    from lookahead_rag.bench.sampling_args import Sampling
    from lookahead_rag.bench.serve_client import generation_params

    g = generation_params("none", 16)
    assert (g.max_new_tokens, g.mode, g.temperature, g.HasField("seed")) == (16, "none", 0.0, False)
    assert generation_params("", 16, Sampling()) == generation_params("", 16)
    s = generation_params("", 16, Sampling(temperature=0.7, top_p=0.9, top_k=20, seed=3))
    assert s.temperature == pytest.approx(0.7) and s.top_p == pytest.approx(0.9)
    assert (s.top_k, s.HasField("seed"), s.seed) == (20, True, 3)


def test_a_sampling_request_answered_greedily_or_with_another_seed_is_an_error() -> None:
    from lookahead_rag.bench.sampling_args import Sampling
    from lookahead_rag.bench.serve_client import sampling_mismatch
    from lookahead_rag.v1 import events_pb2

    s = Sampling(temperature=0.7, seed=3)
    assert sampling_mismatch(events_pb2.GenerationStats(sampled=True, seed=3), s) is None
    assert sampling_mismatch(events_pb2.GenerationStats(sampled=False), s) == "NOT_SAMPLED"
    assert sampling_mismatch(events_pb2.GenerationStats(sampled=True, seed=4), s) == "NOT_SAMPLED"
    assert sampling_mismatch(events_pb2.GenerationStats(), Sampling()) is None  # greedy: nothing to check
