"""bench serve --replicas without processes: its arguments, the synthetic tenants and the ratios."""

from __future__ import annotations

import pytest

from lookahead_rag.bench.serve_args import parse_args
from lookahead_rag.bench.serve_load import ReplayPrompt
from lookahead_rag.bench.serve_replicas import kafka_env, ratios, synthetic_tenants


def test_replicas_need_a_replay_file_and_known_routings() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--replicas", "2"])
    assert parse_args([]).replicas == 0 and parse_args([]).routings == ["round_robin", "tenant"]


def test_a_repeated_prompt_keeps_its_synthetic_tenant() -> None:
    prompts = [ReplayPrompt("bench", tuple(range(i % 5, 40))) for i in range(30)]
    tenants = synthetic_tenants(prompts, 8)
    by_prompt: dict[tuple[int, ...], set[str]] = {}
    for p in tenants:
        by_prompt.setdefault(p.prompt_ids, set()).add(p.tenant)
    assert all(len(t) == 1 for t in by_prompt.values())  # one tenant per distinct prompt
    assert len({p.tenant for p in tenants}) > 1 and all(p.tenant.startswith("tenant-") for p in tenants)
    assert synthetic_tenants(prompts, 0) == prompts  # 0: as recorded


def test_ratios_compare_each_routing_with_round_robin() -> None:
    levels = {"4": {"round_robin": {"prefix_hit_tokens": 100, "goodput_tokens_per_s": 10.0, "ttft_p50_s": 2.0,
                                    "ttft_p99_s": 4.0},
                    "tenant": {"prefix_hit_tokens": 300, "goodput_tokens_per_s": 12.0, "ttft_p50_s": 1.0,
                               "ttft_p99_s": 4.0}}}
    got = ratios(levels)["4:tenant"]
    assert got["prefix_hit_tokens"] == pytest.approx(3.0) and got["goodput"] == pytest.approx(1.2)
    assert got["ttft_p50"] == pytest.approx(0.5)


def test_each_run_has_its_own_topic_and_groups() -> None:
    a, b = kafka_env("run-a"), kafka_env("run-b")
    assert a["LAR_KAFKA_TOPIC"] != b["LAR_KAFKA_TOPIC"] and set(a) == set(b)
