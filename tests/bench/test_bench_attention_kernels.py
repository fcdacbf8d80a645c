"""The attention benchmark (``bench/attention_kernels.py``) on small cases: every way timed at every case, and
every way computes the same attention (its PNG: test_bench_plots)."""

from __future__ import annotations

import math

import torch

from lookahead_rag.bench.attention_kernels import Case, layer_segments, time_cases, visible, ways


def test_every_way_is_timed_at_every_case() -> None:
    cases = [Case("tree 3", 3, 10), Case("2 x chunk 4", 4, 6, requests=2, causal=True)]
    timed = ways()
    assert "sdpa" in timed  # the baseline is always there
    ms = time_cases(timed, cases, heads=4, kv_heads=2, head_dim=64, layers=2, repeats=1)
    assert set(ms) == set(timed)
    assert all(set(by) == {"tree 3", "2 x chunk 4"} and all(v > 0 for v in by.values()) for by in ms.values())


def test_a_tree_case_is_two_chains_under_its_root_and_a_chunk_is_causal() -> None:
    tree = visible(Case("tree 5", 5, 0))
    # node 1 and node 2 hang from the root; 3 under 1, 4 under 2
    assert tree.tolist() == [[True, False, False, False, False], [True, True, False, False, False],
                             [True, False, True, False, False], [True, True, False, True, False],
                             [True, False, True, False, True]]
    assert torch.equal(visible(Case("chunk 4", 4, 0, causal=True)), torch.ones(4, 4, dtype=torch.bool).tril())


def test_every_way_computes_the_same_attention() -> None:
    segs = layer_segments(Case("2 x tree 6", 6, 20, requests=2), heads=4, kv_heads=2, head_dim=64, layers=1)[0]
    results = {}
    for name, way in ways().items():
        way(segs, 1 / math.sqrt(64))
        results[name] = [s[5].clone() for s in segs]
    for name, outs in results.items():
        for got, want in zip(outs, results["sdpa"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
